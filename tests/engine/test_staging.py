"""The staging-buffer protocol: a pinned buffer is rewritten only after its last copy ran.

A fake fence records what the buffer asks of it; the real one is a CUDA event, and
benchmarks/gpu_check.sh shows the race on a GPU (a copy delayed behind a long kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from helpers.hf_reference import random_prompts

from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.runner.cuda_graphs import DecodeRunner
from kvrelay_worker.engine.runner.staging import Fence, StagingBuffer


class FakeFence:
    """Logs ``record``/``synchronize`` calls in order, with the fence's number."""

    def __init__(self, log: list[str], number: int) -> None:
        self.log = log
        self.number = number

    def record(self) -> None:
        self.log.append(f"record{self.number}")

    def synchronize(self) -> None:
        self.log.append(f"wait{self.number}")


def fence_factory(log: list[str]) -> Callable[[], Fence]:
    made: list[FakeFence] = []

    def new_fence() -> FakeFence:
        made.append(FakeFence(log, len(made)))
        return made[-1]

    return new_fence


def test_reuse_waits_for_the_last_copy() -> None:
    log: list[str] = []
    buffer = StagingBuffer(8, torch.int64, torch.device("cpu"), fence_factory(log))
    dst = torch.zeros(6, dtype=torch.int64)
    view = buffer.writable((6,))  # nothing copied yet: nothing to wait for
    assert log == []
    view.copy_(torch.arange(6))
    buffer.copy_to(dst, view)
    assert log == ["record0"]
    assert dst.tolist() == [0, 1, 2, 3, 4, 5]
    second = buffer.writable((2, 3))
    assert log == ["record0", "wait0"]
    assert second.shape == (2, 3)
    assert second.is_contiguous()
    buffer.writable((4,))  # that copy is known to have run: no second wait
    assert log == ["record0", "wait0"]


def test_cpu_buffers_need_no_fence() -> None:
    buffer = StagingBuffer(4, torch.int32, torch.device("cpu"))
    dst = torch.zeros(4, dtype=torch.int32)
    view = buffer.writable((4,))
    view.fill_(7)
    buffer.copy_to(dst, view)
    view = buffer.writable((4,))
    view.fill_(9)
    assert dst.tolist() == [7] * 4
    assert not buffer.host.is_pinned()


def test_decode_runner_writes_staging_only_after_the_previous_copy(
        tiny_model: Callable[[str], Path]) -> None:
    """Every step of the padded decode path waits on its buffers' fences before writing.

    Fails on the old runner (it wrote its pinned mirrors with no fence at all).
    """
    folder = str(tiny_model("qwen2-gqa-bias-tied"))
    prompts = random_prompts([3, 9, 21], seed=5)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    llm = LLM(folder, device="cpu", dtype="float32", max_num_seqs=4)
    engine = llm.engine
    log: list[str] = []
    runner = DecodeRunner(engine.model, max_batch=4, max_model_len=engine.max_model_len,
                          block_size=engine.config.block_size, device=engine.device,
                          new_fence=fence_factory(log))
    engine.runner.decode_runner = runner
    llm.generate(prompts, params)
    steps = sum(runner.runs_by_bucket.values())
    assert steps >= 5
    # Fence 0 guards the packed per-token inputs, fence 1 the block tables: each step
    # records both, and each later step waits on both before writing either buffer.
    assert log[:2] == ["record0", "record1"]
    assert log[2:] == ["wait0", "wait1", "record0", "record1"] * (steps - 1)
