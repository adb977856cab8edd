"""``KVRELAY_CPU_THREADS``: a count when set; unset, what ``OMP_NUM_THREADS`` asked when
that is set, else the usable CPUs; refused at start when it is no positive integer."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from kvrelay_worker.cpu_threads import apply_cpu_threads, choose_cpu_threads
from kvrelay_worker.settings import SettingsError, WorkerSettings
from kvrelay_worker.usable_cpus import UsableCpus


def _cpus(count: int) -> UsableCpus:
    return UsableCpus(count, affinity=8, quota=count if count < 8 else None)


def test_a_set_count_wins_over_everything() -> None:
    choice = choose_cpu_threads(3, {"OMP_NUM_THREADS": "1"}, lambda: _cpus(2))
    assert (choice.count, choice.reason) == (3, "KVRELAY_CPU_THREADS=3")


def test_unset_it_keeps_what_omp_num_threads_asked() -> None:
    choice = choose_cpu_threads(None, {"OMP_NUM_THREADS": "1"}, lambda: _cpus(2))
    assert choice.count is None
    assert choice.reason == "KVRELAY_CPU_THREADS unset, torch's from OMP_NUM_THREADS=1"


def test_unset_without_omp_it_is_the_usable_cpus() -> None:
    choice = choose_cpu_threads(None, {}, lambda: _cpus(2))
    assert choice.count == 2
    assert choice.reason == ("KVRELAY_CPU_THREADS unset: 2 usable CPUs "
                             "(affinity 8, cgroup quota 2)")


def test_the_offline_rule_keeps_a_lower_count_and_lowers_a_higher_one() -> None:
    kept = choose_cpu_threads(None, {}, lambda: _cpus(4), name="cpu_threads", current=2)
    assert kept.count is None
    assert kept.reason.startswith("cpu_threads unset, torch's 2: within 4 usable CPUs")
    assert choose_cpu_threads(None, {}, lambda: _cpus(4), current=16).count == 4


@pytest.mark.parametrize("bad", [0, -2, True, 1.5])
def test_a_count_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(ValueError, match="cpu_threads must be a positive integer"):
        choose_cpu_threads(bad, {}, lambda: _cpus(2), name="cpu_threads")  # type: ignore[arg-type]


def test_the_worker_setting_is_read_from_its_variable() -> None:
    assert WorkerSettings.from_env({}).cpu_threads is None
    assert WorkerSettings.from_env({"KVRELAY_CPU_THREADS": "3"}).cpu_threads == 3


@pytest.mark.parametrize(("raw", "message"), [
    ("0", "KVRELAY_CPU_THREADS must be a positive integer"),
    ("-1", "KVRELAY_CPU_THREADS must be a positive integer"),
    ("two", "KVRELAY_CPU_THREADS must be int, got 'two'"),
    ("1.5", "KVRELAY_CPU_THREADS must be int, got '1.5'"),
])
def test_the_worker_refuses_a_bad_count_at_start(raw: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        WorkerSettings.from_env({"KVRELAY_CPU_THREADS": raw})


@pytest.fixture
def torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("torch_threads")
def test_a_thread_started_after_the_choice_runs_with_it() -> None:
    """The worker chooses on its main thread; the engine thread, started afterwards,
    computes with that count (torch hands it to each thread at its first op)."""
    apply_cpu_threads(1, {})
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert seen == [1]
