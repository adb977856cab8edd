"""A simulated worker serves jobs end to end through the SDK, on the real worker path.

Real redis-server, real Celery worker process with ``KVRELAY_MODEL=simulated``: tokens,
finish reasons and ``seq`` must be those of a real worker, its steps must batch the jobs
(steps far fewer than tokens), and the modeled time must follow the configured step-time
model exactly (checked from the worker's own stats, not from a clock).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient

pytestmark = pytest.mark.integration

STEP_MS, TOKEN_MS = 2.0, 0.01


async def test_simulated_worker_streams_batched_jobs_to_the_sdk(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    worker = start_worker("sim", model="simulated", concurrency=16,
                          simulated_step_ms=STEP_MS, simulated_token_ms=TOKEN_MS)
    async with AsyncClient(clean_redis_url, model="simulated") as client:

        async def one(i: int) -> tuple[list[int], list[str], list[int], int]:
            seqs: list[int] = []
            async with client.stream(prompt=f"request {i}: " + "word " * 20,
                                     max_tokens=10 + i, n=2 if i % 4 == 0 else 1) as stream:
                async for chunk in stream:
                    seqs.append(chunk.seq)
                final = await stream.final()
            counts = [len(c.token_ids) for c in final.choices]
            reasons = [c.finish_reason or "" for c in final.choices]
            return seqs, reasons, counts, final.usage.completion_tokens

        results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(16))), 60)
        # A stop string found in the text ends the job early, with "stop".
        probe = await client.generate(prompt="stop probe", max_tokens=8)
        stop_at = " " + probe.text.split(" ")[4]  # the 4th token's text
        stopped = await asyncio.wait_for(
            client.generate(prompt="stop probe", max_tokens=8, stop=[stop_at]), 30)

    for i, (seqs, reasons, counts, completion) in enumerate(results):
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        n = 2 if i % 4 == 0 else 1
        assert reasons == ["length"] * n
        assert counts == [10 + i] * n
        assert completion == (10 + i) * n
    assert stopped.finish_reason == "stop"
    assert stopped.text == " ".join(probe.text.split(" ")[:4])

    stats = worker.wait_for_stats(lambda s: s["requests"] == 0)
    total = sum(c for _, _, _, c in results) + len(probe.token_ids) + len(stopped.token_ids)
    assert stats["simulated"] is True
    assert stats["max_batch_size"] >= 8
    # Batched: far fewer steps than tokens (one step per token would mean no batching).
    assert stats["steps"] <= total / 4
    assert stats["simulated_modeled_s"] == pytest.approx(
        (stats["steps"] * STEP_MS + stats["simulated_batched_tokens"] * TOKEN_MS) / 1000)


def test_a_simulated_worker_process_holds_no_torch(
        start_worker: Callable[..., WorkerProcess]) -> None:
    worker = start_worker("small", model="simulated", concurrency=4)
    maps = Path(f"/proc/{worker.pid}/maps").read_text()
    assert "libtorch" not in maps
    rss_kib = next(int(line.split()[1]) for line in
                   Path(f"/proc/{worker.pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
    assert rss_kib < 200 * 1024, f"a simulated worker holds {rss_kib} KiB"
