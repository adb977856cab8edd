"""Jobs submitted together are batched by the worker's engine, and every stream completes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient

pytestmark = pytest.mark.integration


async def test_32_concurrent_jobs_share_batches(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    worker = start_worker("batcher", concurrency=32)
    async with AsyncClient(clean_redis_url, model="llama-mqa") as client:

        async def one(i: int) -> tuple[list[int], str, int]:
            seqs: list[int] = []
            async with client.stream(prompt_token_ids=[100 + i, 200, 300 + i], max_tokens=48,
                                     temperature=0.0, ignore_eos=True) as stream:
                async for chunk in stream:
                    seqs.append(chunk.seq)
                final = await stream.final()
            return seqs, final.finish_reason or "", len(final.token_ids)

        results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(32))), 120)
    for seqs, reason, count in results:
        assert reason == "length"
        assert count == 48
        # Token events are numbered after Started (seq 0) with no gap.
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    stats = worker.wait_for_stats(lambda s: s["free_blocks"] == s["total_blocks"])
    assert stats["max_batch_size"] >= 16, stats
