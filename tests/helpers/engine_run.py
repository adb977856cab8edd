"""Driving an ``LLMEngine`` to completion in tests, with a bound so nothing hangs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kvrelay_worker.engine import LLMEngine, RequestOutput, StepOutput


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch on one intra-op thread, then restore the previous count.

    Tiny models spend their time in small matmuls; on a 2-core machine shared with other
    test processes, torch's thread pool oversubscribes the cores and runs them about ten
    times slower than one thread does.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_engine(engine: LLMEngine, max_steps: int = 2000) -> dict[str, list[StepOutput]]:
    """Step until the engine has no request left; every ``StepOutput`` by request id."""
    outputs: dict[str, list[StepOutput]] = defaultdict(list)
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return dict(outputs)
        for out in engine.step():
            outputs[out.request_id].append(out)
    raise AssertionError(f"the engine did not finish within {max_steps} steps")


def final_outputs(outputs: dict[str, list[StepOutput]]) -> dict[str, RequestOutput]:
    """The finished ``RequestOutput`` of each request (exactly one per request)."""
    finals: dict[str, RequestOutput] = {}
    for request_id, steps in outputs.items():
        done = [s.output for s in steps if s.output is not None]
        assert len(done) == 1, f"{request_id} finished {len(done)} times"
        assert steps[-1].finished
        finals[request_id] = done[0]
    return finals


def assert_engine_idle(engine: LLMEngine) -> None:
    """Nothing queued, nothing running, every KV block free."""
    stats = engine.stats()
    assert stats["running"] == 0
    assert stats["waiting"] == 0
    assert stats["requests"] == 0
    assert stats["free_blocks"] == stats["total_blocks"], "KV blocks leaked"
