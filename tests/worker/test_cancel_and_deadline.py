"""Cancel frees a running job's blocks at once; aborted or expired queued jobs never run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from helpers.job_log import read_events, wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient, Cancelled, DeadlineExceeded
from kvrelay.protocol import Failed, Started, Tokens

pytestmark = pytest.mark.integration

LONG = {"prompt_token_ids": [11, 12, 13, 14], "max_tokens": 3000, "temperature": 0.0,
        "ignore_eos": True}


async def test_cancel_running_job_frees_its_blocks(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    worker = start_worker("canceller", concurrency=4)
    async with AsyncClient(clean_redis_url, model="llama-mqa") as client:
        stream = client.stream(**LONG)
        chunks = 0
        async with stream:
            async for _ in stream:
                chunks += 1
                if chunks == 5:
                    busy = worker.wait_for_stats(lambda s: s["free_blocks"] < s["total_blocks"])
                    assert busy["running"] >= 1
                    break
        job_id = stream.job_id
    stats = worker.wait_for_stats(lambda s: s["free_blocks"] == s["total_blocks"], timeout=10)
    assert stats["running"] == 0
    events = wait_terminal(clean_redis_url, job_id)
    assert isinstance(events[-1], Failed)
    assert events[-1].code == "cancelled"
    generated = sum(len(e.token_ids) for e in events if isinstance(e, Tokens))
    assert 5 <= generated < 3000


async def test_aborted_queued_job_never_starts(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    # One slot: the first job holds it, so the second waits in the queue.
    start_worker("single", concurrency=1)
    async with AsyncClient(clean_redis_url, model="llama-mqa") as client:
        blocker = client.stream(**LONG)
        await blocker.start()
        await blocker.__anext__()  # the worker is busy with it now
        queued = client.stream(prompt_token_ids=[5, 6, 7], max_tokens=8)
        await queued.start()
        await client.cancel(queued.job_id)
        await blocker.aclose()  # frees the slot; the worker now takes the queued copy
        events = await asyncio.to_thread(wait_terminal, clean_redis_url, queued.job_id)
        assert [type(e) for e in events] == [Failed]
        assert events[0].code == "cancelled"
        with pytest.raises(Cancelled):
            await queued.final()


async def test_expired_job_fails_without_tokens(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    start_worker("clock", concurrency=2)
    async with AsyncClient(clean_redis_url, model="llama-mqa") as client:
        # A deadline already in the past when the worker picks the job up.
        stream = client.stream(prompt_token_ids=[1, 2, 3], max_tokens=8, timeout=0.001)
        with pytest.raises(DeadlineExceeded):
            await stream.final()
        job_id = stream.job_id
    events = wait_terminal(clean_redis_url, job_id)
    assert not any(isinstance(e, (Started, Tokens)) for e in events), events
    assert isinstance(events[-1], Failed)
    assert events[-1].code == "deadline_exceeded"


async def test_running_job_past_its_deadline_is_stopped(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    worker = start_worker("timer", concurrency=2)
    async with AsyncClient(clean_redis_url, model="llama-mqa") as client:
        stream = client.stream(**LONG, timeout=1.5)
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await stream.final()
        assert time.monotonic() - start < 10
        job_id = stream.job_id
    events = wait_terminal(clean_redis_url, job_id)
    assert any(isinstance(e, Tokens) for e in read_events(clean_redis_url, job_id))
    assert isinstance(events[-1], Failed)
    assert events[-1].code in ("deadline_exceeded", "cancelled")
    worker.wait_for_stats(lambda s: s["free_blocks"] == s["total_blocks"], timeout=10)
