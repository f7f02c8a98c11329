"""The compile pool's core count: the affinity mask, capped by a cgroup CPU quota (v2 or v1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fasta_sm.triton.cores import cgroup_cpu_quota, usable_cores

affinity_only = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs Linux's sched_getaffinity")

V1_QUOTA = {"cpu.cfs_quota_us": "150000\n", "cpu.cfs_period_us": "100000\n"}

LAYOUTS = {
    "v2, the process's own cgroup": (
        "0::/kubepods/pod1/c1\n",
        {"kubepods/pod1/c1/cpu.max": "250000 100000\n"},
        2.5,
    ),
    "v2, the tightest of its ancestors": (
        "0::/slice/service\n",
        {"slice/service/cpu.max": "max 100000\n", "slice/cpu.max": "300000 100000\n", "cpu.max": "800000 100000\n"},
        3.0,
    ),
    "v2, a container's namespace (the quota at the mount)": ("0::/\n", {"cpu.max": "400000 100000\n"}, 4.0),
    "v1, the cpu controller's folder": (
        "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n",
        {f"cpu,cpuacct/docker/abc/{name}": text for name, text in V1_QUOTA.items()},
        1.5,
    ),
    "none anywhere": (
        "1:cpu:/\n0::/\n",
        {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n", "cpu.max": "max 100000\n"},
        None,
    ),
    "odd lines and files": ("garbage\n0::/a\n", {"a/cpu.max": "not numbers\n"}, None),
}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _cgroups(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    _write(tmp_path / "proc", proc)
    for name, text in files.items():
        _write(tmp_path / "cg" / name, text)
    return tmp_path / "cg", tmp_path / "proc"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_cpu_quota_is_read_in_cores_from_each_cgroup_layout(tmp_path, layout):
    proc, files, cores = LAYOUTS[layout]
    assert cgroup_cpu_quota(*_cgroups(tmp_path, proc, files)) == cores


def test_no_proc_cgroup_file_means_no_quota(tmp_path):
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "missing") is None


def test_a_v1_quota_is_found_when_proc_names_the_controllers_in_another_order(tmp_path):
    """CentOS 7 writes `cpuacct,cpu` in /proc/self/cgroup; the mount is `cpu,cpuacct`, with a `cpu` link to it."""
    root, proc = _cgroups(tmp_path, "3:cpuacct,cpu:/system.slice/docker-abc.scope\n",
                          {f"cpu,cpuacct/{name}": text.replace("150000", "200000") for name, text in V1_QUOTA.items()})
    (root / "cpu").symlink_to("cpu,cpuacct")
    assert cgroup_cpu_quota(root, proc) == 2.0


@affinity_only
@pytest.mark.parametrize(("quota", "expected"), [("50000 100000\n", 1), ("100000000 100000\n", None)])
def test_usable_cores_are_the_affinity_capped_by_the_quota_rounded_up(tmp_path, quota, expected):
    affinity = len(os.sched_getaffinity(0))
    if expected is not None and affinity < 2:
        pytest.skip("needs at least two cores in the affinity mask to show a cap")
    assert usable_cores(*_cgroups(tmp_path, "0::/\n", {"cpu.max": quota})) == (expected or affinity)
