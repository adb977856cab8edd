"""The staging-buffer race on a real GPU (skipped without CUDA).

A non-blocking copy from pinned memory queued behind a long kernel (``torch.cuda._sleep``)
reads its source when the stream reaches it. Rewriting the buffer before then changes
what the copy delivers: the race, shown first on a bare pinned buffer. ``StagingBuffer``
waits for the copy's event before handing the buffer out again, and the copy delivers
what was written before it; the decode runner then gives the same tokens when every
copy is delayed that way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.hf_reference import random_prompts

from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.runner.staging import StagingBuffer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

SLEEP_CYCLES = 200_000_000  # ~0.1 s on a 2 GHz GPU: far longer than the host's rewrite
N = 1 << 16


def test_rewriting_a_pinned_buffer_under_a_queued_copy_races() -> None:
    """The hazard exists: without a fence the copy delivers the *next* step's values."""
    host = torch.full((N,), 1, dtype=torch.int64, pin_memory=True)
    dst = torch.zeros(N, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    dst.copy_(host, non_blocking=True)
    host.fill_(2)  # the next step's inputs, written while the copy still waits
    torch.cuda.synchronize()
    assert int(dst[0]) == 2, "the copy ran before the rewrite: race not reproduced"


def test_staging_buffer_waits_for_its_copy_before_a_rewrite() -> None:
    staging = StagingBuffer(N, torch.int64, torch.device("cuda"))
    dst = torch.zeros(N, dtype=torch.int64, device="cuda")
    view = staging.writable((N,))
    view.fill_(1)
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    staging.copy_to(dst, view)
    staging.writable((N,)).fill_(2)  # waits for the copy first
    torch.cuda.synchronize()
    assert torch.equal(dst, torch.ones_like(dst))


def test_decode_steps_with_delayed_copies_give_the_same_tokens(
        tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every staging copy queued behind a sleep; a tiny token budget makes steps in which
    no row samples (so nothing reads back between two writes of the buffers)."""
    folder = str(tiny_model("qwen2-gqa-bias-tied"))
    prompts = random_prompts([1, 1, 1, 10], seed=11)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    options = {"device": "cuda", "dtype": "float32", "max_num_seqs": 4,
               "max_num_batched_tokens": 4, "gpu_memory_utilization": 0.2}
    expected = [o.token_ids for o in LLM(folder, **options).generate(prompts, params)]
    original = StagingBuffer.copy_to

    def delayed(self: StagingBuffer, dst: torch.Tensor, view: torch.Tensor) -> None:
        torch.cuda._sleep(SLEEP_CYCLES // 20)
        original(self, dst, view)

    monkeypatch.setattr(StagingBuffer, "copy_to", delayed)
    got = [o.token_ids for o in LLM(folder, **options).generate(prompts, params)]
    assert got == expected


def test_host_to_device_copies_survive_the_next_one() -> None:
    """``host_to_device`` stages through a fresh pinned tensor per call; torch's pinned
    allocator keeps it reserved until the queued copy has run, so a second call while the
    first copy waits cannot overwrite the first one's source."""
    from kvrelay_worker.engine.runner.transfer import host_to_device

    cuda = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    first = host_to_device(torch.full((N,), 1, dtype=torch.int64), cuda)
    second = host_to_device(torch.full((N,), 2, dtype=torch.int64), cuda)
    torch.cuda.synchronize()
    assert torch.equal(first, torch.ones_like(first))
    assert torch.equal(second, torch.full_like(second, 2))
