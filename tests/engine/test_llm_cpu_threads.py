"""The offline ``LLM`` sets torch's threads as a worker does, before its model loads:
``cpu_threads=N`` sets N; unset, a count above the usable CPUs is lowered to them, and a
lower one (a script's ``torch.set_num_threads``) or ``OMP_NUM_THREADS``'s stays."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from kvrelay_worker.engine.llm import LLM
from kvrelay_worker.models.errors import UnknownModelError
from kvrelay_worker.usable_cpus import usable_cpus


@pytest.fixture(autouse=True)
def torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _llm(tiny_model: Callable[[str], Path], cpu_threads: int | None = None) -> LLM:
    return LLM(str(tiny_model("llama-mqa")), device="cpu", num_kv_blocks=8, max_num_seqs=1,
               cpu_threads=cpu_threads)


def test_a_given_count_is_set(tiny_model: Callable[[str], Path]) -> None:
    llm = _llm(tiny_model, cpu_threads=1)
    assert torch.get_num_threads() == 1
    assert llm.cpu_threads.reason == "cpu_threads=1"


def test_unset_more_threads_than_usable_cpus_are_lowered_and_fewer_kept(
        tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    usable = usable_cpus().count
    torch.set_num_threads(usable + 3)  # torch's default on a host larger than the quota
    _llm(tiny_model)
    assert torch.get_num_threads() == usable
    torch.set_num_threads(1)  # asked for by the script: stays
    assert _llm(tiny_model).cpu_threads.count is None
    assert torch.get_num_threads() == 1


def test_unset_omp_num_threads_is_kept_and_the_choice_precedes_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set before any weight loads (so a model that does not exist shows it)."""
    many = usable_cpus().count + 3
    torch.set_num_threads(many)
    monkeypatch.setenv("OMP_NUM_THREADS", str(many))
    with pytest.raises(UnknownModelError):
        LLM("no-such-model", device="cpu")
    assert torch.get_num_threads() == many
    monkeypatch.delenv("OMP_NUM_THREADS")
    with pytest.raises(UnknownModelError):
        LLM("no-such-model", device="cpu")
    assert torch.get_num_threads() == many - 3


def test_a_bad_count_is_refused() -> None:
    with pytest.raises(ValueError, match="cpu_threads must be a positive integer, got 0"):
        LLM("no-such-model", device="cpu", cpu_threads=0)
