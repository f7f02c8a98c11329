"""How many cores this process may use: its CPU affinity, capped by its cgroup's CPU quota.

A container with a CPU limit (Kubernetes' `resources.limits.cpu`, `docker
run --cpus`) still sees every core of its host in its affinity mask, so a
pool sized by the mask alone would start a worker per host core, each
holding a Triton compiler's memory, to share the few cores the quota
allows.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cores(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """The cores in this process's affinity mask, at most its cgroup's CPU quota rounded up; at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root, proc_cgroup)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def cgroup_cpu_quota(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The tightest CPU quota, in cores, on this process's cgroup or its ancestors (v2 or v1); None if none."""
    try:
        memberships = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for line in memberships:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            quotas += [_v2_quota(d / "cpu.max") for d in _with_ancestors(cgroup_root, path)]
        elif "cpu" in controllers.split(","):
            quotas += [_v1_quota(d) for d in _with_ancestors(_v1_mount(cgroup_root, controllers), path)]
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def _v1_mount(cgroup_root: Path, controllers: str) -> Path:
    """The v1 cpu controller's mount: named as /proc lists its controllers, else `cpu` (CentOS 7 lists
    `cpuacct,cpu` for a mount named `cpu,cpuacct`; systemd and Docker link `cpu` to it)."""
    named = cgroup_root / controllers
    return named if named.is_dir() else cgroup_root / "cpu"


def _with_ancestors(mount: Path, path: str) -> list[Path]:
    """`mount/path` and each folder above it up to `mount`: a quota on any of them binds the process.

    Inside a container's cgroup namespace the path is "/" and the mount is the container's own cgroup.
    """
    parts = [p for p in path.strip("/").split("/") if p]
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _v2_quota(cpu_max: Path) -> float | None:
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return _cores(quota, period)


def _v1_quota(directory: Path) -> float | None:
    try:
        quota = (directory / "cpu.cfs_quota_us").read_text().strip()
        period = (directory / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return _cores(quota, period)


def _cores(quota: str, period: str) -> float | None:
    """quota / period, or None where either is not a positive number (v1 writes -1 for no quota)."""
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None
