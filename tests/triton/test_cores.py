"""The compile pool's core count: the affinity mask, capped by a cgroup CPU quota (v2 or v1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fasta_sm.triton.cores import cgroup_cpu_quota, usable_cores

affinity_only = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs Linux's sched_getaffinity")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_v2_quota_of_the_process_cgroup_is_read_in_cores(tmp_path):
    _write(tmp_path / "proc", "0::/kubepods/pod1/c1\n")
    _write(tmp_path / "cg/kubepods/pod1/c1/cpu.max", "250000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 2.5


def test_a_v2_quota_on_an_ancestor_binds_when_it_is_the_tightest(tmp_path):
    _write(tmp_path / "proc", "0::/slice/service\n")
    _write(tmp_path / "cg/slice/service/cpu.max", "max 100000\n")
    _write(tmp_path / "cg/slice/cpu.max", "300000 100000\n")
    _write(tmp_path / "cg/cpu.max", "800000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 3.0


def test_a_container_namespace_reads_the_quota_at_the_mount(tmp_path):
    _write(tmp_path / "proc", "0::/\n")
    _write(tmp_path / "cg/cpu.max", "400000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 4.0


def test_a_v1_quota_is_read_from_the_cpu_controller(tmp_path):
    _write(tmp_path / "proc", "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    _write(tmp_path / "cg/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "150000\n")
    _write(tmp_path / "cg/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 1.5


def test_no_quota_anywhere_is_none(tmp_path):
    _write(tmp_path / "proc", "1:cpu:/\n0::/\n")
    _write(tmp_path / "cg/cpu/cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cg/cpu/cpu.cfs_period_us", "100000\n")
    _write(tmp_path / "cg/cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") is None


def test_an_unreadable_or_odd_cgroup_file_means_no_quota(tmp_path):
    _write(tmp_path / "proc", "garbage\n0::/a\n")
    _write(tmp_path / "cg/a/cpu.max", "not numbers\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") is None
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "missing") is None


@affinity_only
def test_usable_cores_are_the_quota_rounded_up_when_it_is_below_the_affinity(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs at least two cores in the affinity mask to show a cap")
    _write(tmp_path / "proc", "0::/\n")
    _write(tmp_path / "cg/cpu.max", "50000 100000\n")
    assert usable_cores(tmp_path / "cg", tmp_path / "proc") == 1


@affinity_only
def test_usable_cores_are_the_affinity_when_the_quota_is_larger(tmp_path):
    _write(tmp_path / "proc", "0::/\n")
    _write(tmp_path / "cg/cpu.max", "100000000 100000\n")
    assert usable_cores(tmp_path / "cg", tmp_path / "proc") == len(os.sched_getaffinity(0))


def test_a_v1_quota_is_found_when_proc_names_the_controllers_in_another_order(tmp_path):
    """CentOS 7 writes `cpuacct,cpu` in /proc/self/cgroup; the mount is `cpu,cpuacct`, with a `cpu` link to it."""
    _write(tmp_path / "proc", "3:cpuacct,cpu:/system.slice/docker-abc.scope\n")
    _write(tmp_path / "cg/cpu,cpuacct/cpu.cfs_quota_us", "200000\n")
    _write(tmp_path / "cg/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    (tmp_path / "cg/cpu").symlink_to("cpu,cpuacct")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 2.0
