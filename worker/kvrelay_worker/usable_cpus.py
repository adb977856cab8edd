"""How many CPUs this process may actually keep busy: its affinity mask and its cgroup's
CPU quota, whichever is smaller.

torch sizes its intra-op pool from the machine's cores, so a worker pinned to 2 cores or
limited to 2 CPUs by a container quota on a 64-core host would run 64 OpenMP threads on
2 CPUs' worth of time, and every barrier of every step would wait for a descheduled one.
Torch-free, so the settings and the CLI can use it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
# cgroup v1 mounts its cpu controller under one of these names (the first on most hosts).
_V1_CPU_DIRS = ("cpu,cpuacct", "cpu")


@dataclass(frozen=True)
class UsableCpus:
    """The usable count and what it came from (for the worker's start line)."""

    count: int
    affinity: int
    # CPUs the cgroup quota allows, rounded up; None: no quota.
    quota: int | None

    def describe(self) -> str:
        quota = "no cgroup CPU quota" if self.quota is None else f"cgroup quota {self.quota}"
        return f"{self.count} usable CPUs (affinity {self.affinity}, {quota})"


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask, else the machine's count (not Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def usable_cpus(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> UsableCpus:
    """min(affinity mask, cgroup CPU quota rounded up), at least 1."""
    affinity = max(affinity_cpus(), 1)
    quota = cgroup_cpu_quota(cgroup_root, proc_cgroup)
    count = affinity if quota is None else min(affinity, quota)
    return UsableCpus(max(count, 1), affinity, quota)


def cgroup_cpu_quota(cgroup_root: Path = CGROUP_ROOT,
                     proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The tightest CPU quota over this process's cgroup and its ancestors, in whole CPUs
    (rounded up), from cgroup v2's ``cpu.max`` or v1's ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``; None when no level sets one or nothing can be read."""
    own = _own_cgroups(proc_cgroup)
    limits: list[int] = []
    for directory in _levels(cgroup_root, own.get("", "/")):
        limits += _v2_limit(directory / "cpu.max")
    for name in _V1_CPU_DIRS:
        mount = cgroup_root / name
        if mount.is_dir():
            for directory in _levels(mount, own.get("cpu", "/")):
                limits += _v1_limit(directory)
            break  # "cpu" is often a link to "cpu,cpuacct": read the controller once
    return min(limits) if limits else None


def _own_cgroups(proc_cgroup: Path) -> dict[str, str]:
    """This process's cgroup path per controller: "" for v2 (``0::/path``), "cpu" for v1's
    cpu controller (``4:cpu,cpuacct:/path``)."""
    try:
        text = proc_cgroup.read_text()
    except OSError:
        return {}
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths[""] = path
        elif "cpu" in controllers.split(","):
            paths["cpu"] = path
    return paths


def _levels(mount: Path, path: str) -> list[Path]:
    """The directories of ``path`` under ``mount`` and of each ancestor, and the mount itself
    (in a container the mount is the process's own cgroup while ``path`` names the host's)."""
    levels = [mount]
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    for depth in range(1, len(parts) + 1):
        directory = mount.joinpath(*parts[:depth])
        if directory.is_dir():
            levels.append(directory)
    return levels


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpus(quota: int, period: int) -> list[int]:
    """The quota in whole CPUs (rounded up), or nothing when it sets no limit."""
    if quota <= 0 or period <= 0:
        return []
    return [max(math.ceil(quota / period), 1)]


def _v2_limit(cpu_max: Path) -> list[int]:
    """``cpu.max`` holds "QUOTA PERIOD" in microseconds, or "max PERIOD" for no limit."""
    text = _read(cpu_max)
    if text is None:
        return []
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return []
    try:
        return _cpus(int(fields[0]), int(fields[1]))
    except ValueError:
        return []


def _v1_limit(directory: Path) -> list[int]:
    """``cpu.cfs_quota_us`` (-1: no limit) over ``cpu.cfs_period_us``."""
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    if quota is None or period is None:
        return []
    try:
        return _cpus(int(quota), int(period))
    except ValueError:
        return []
