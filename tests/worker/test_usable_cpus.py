"""The usable CPUs: the affinity mask and the cgroup's CPU quota (v2 ``cpu.max``, v1
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), whichever is fewer, read from files laid
out as the kernel lays them out."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrelay_worker import usable_cpus as module
from kvrelay_worker.usable_cpus import affinity_cpus, cgroup_cpu_quota, usable_cpus


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _v2(tmp_path: Path, own: str = "/", levels: dict[str, str] | None = None
        ) -> tuple[Path, Path]:
    """A cgroup v2 mount with ``cpu.max`` per level ("" is the mount itself)."""
    root = tmp_path / "cgroup"
    root.mkdir()
    for level, cpu_max in (levels or {}).items():
        _write(root / level / "cpu.max", cpu_max)
    proc = tmp_path / "proc-self-cgroup"
    _write(proc, f"0::{own}")
    return root, proc


@pytest.mark.parametrize(("cpu_max", "cpus"), [
    ("200000 100000", 2),
    ("150000 100000", 2),  # 1.5 CPUs of time: rounded up
    ("50000 100000", 1),
    ("max 100000", None),
    ("garbage", None),
])
def test_a_v2_quota_in_whole_cpus(tmp_path: Path, cpu_max: str, cpus: int | None) -> None:
    root, proc = _v2(tmp_path, own="/", levels={"": cpu_max})  # a container: its own cgroup at /
    assert cgroup_cpu_quota(root, proc) == cpus


def test_the_tightest_v2_level_on_the_way_up_counts(tmp_path: Path) -> None:
    """A service under a slice: the slice's quota limits it though its own is "max"."""
    root, proc = _v2(tmp_path, own="/system.slice/kvrelay.service",
                     levels={"system.slice": "300000 100000",
                             "system.slice/kvrelay.service": "max 100000"})
    assert cgroup_cpu_quota(root, proc) == 3


def test_a_host_path_absent_in_a_container_falls_back_to_the_mount(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, own="/kubepods/pod123/abc")
    _write(root / "cpu.max", "400000 100000")
    assert cgroup_cpu_quota(root, proc) == 4


@pytest.mark.parametrize(("quota", "period", "cpus"), [
    ("-1", "100000", None),  # what an unlimited v1 cgroup writes
    ("250000", "100000", 3),
    ("100000", "100000", 1),
    ("100000", "0", None),
])
def test_a_v1_quota_in_whole_cpus(tmp_path: Path, quota: str, period: str,
                                  cpus: int | None) -> None:
    root = tmp_path / "cgroup"
    for controller in ("cpu,cpuacct", "memory"):
        (root / controller).mkdir(parents=True)
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", quota)
    _write(root / "cpu,cpuacct" / "cpu.cfs_period_us", period)
    proc = tmp_path / "proc-self-cgroup"
    _write(proc, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/")
    assert cgroup_cpu_quota(root, proc) == cpus


def test_a_v1_quota_of_the_process_own_cgroup(tmp_path: Path) -> None:
    """Outside a container the cgroup's directory is under the mount; "cpu" alone named."""
    root = tmp_path / "cgroup"
    own = root / "cpu" / "user.slice" / "job"
    _write(root / "cpu" / "cpu.cfs_quota_us", "-1")
    _write(root / "cpu" / "cpu.cfs_period_us", "100000")
    _write(own / "cpu.cfs_quota_us", "200000")
    _write(own / "cpu.cfs_period_us", "100000")
    proc = tmp_path / "proc-self-cgroup"
    _write(proc, "2:cpuacct:/user.slice/job\n1:cpu:/user.slice/job")
    assert cgroup_cpu_quota(root, proc) == 2


def test_no_cgroup_files_mean_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path / "none", tmp_path / "none-either") is None


def test_usable_is_the_fewer_of_affinity_and_quota(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "affinity_cpus", lambda: 8)
    root, proc = _v2(tmp_path, levels={"": "300000 100000"})
    assert usable_cpus(root, proc).count == 3
    assert usable_cpus(root, proc).describe() == "3 usable CPUs (affinity 8, cgroup quota 3)"
    root.joinpath("cpu.max").write_text("max 100000\n")
    assert usable_cpus(root, proc).count == 8
    monkeypatch.setattr(module, "affinity_cpus", lambda: 2)
    root.joinpath("cpu.max").write_text("1600000 100000\n")
    assert usable_cpus(root, proc).count == 2
    monkeypatch.setattr(module, "affinity_cpus", lambda: 0)
    assert usable_cpus(root, proc).count == 1


def test_this_machine() -> None:
    """Whatever this host's cgroup layout is, the count is between 1 and the mask's."""
    found = usable_cpus()
    assert 1 <= found.count <= affinity_cpus()
    assert found.affinity == affinity_cpus()
    assert found.quota is None or found.count <= found.quota
