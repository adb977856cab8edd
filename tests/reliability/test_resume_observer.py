"""``resume()`` observes a job: leaving the resumed stream leaves the job running.

A second caller resumes a running job, reads a chunk and leaves: the job still runs to its
end for its first caller, and no abort flag is set. Only ``abort_on_exit=True`` makes
leaving a resumed stream cancel the job. (Before the fix, leaving any resumed stream
aborted the job under its owner.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis
from helpers.job_log import wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient
from kvrelay.keys import Keyspace
from kvrelay.protocol import ErrorCode, Failed, Finished

KEYS = Keyspace()  # the default namespace

pytestmark = pytest.mark.integration

JOB = {"prompt_token_ids": [21, 22, 23], "max_tokens": 300, "temperature": 0.0,
       "ignore_eos": True}


def _abort_flag_set(url: str, job_id: str) -> bool:
    client = redis.Redis.from_url(url)
    try:
        return bool(client.exists(KEYS.abort_flag(job_id)))
    finally:
        client.close()


async def test_leaving_a_resumed_stream_does_not_cancel_the_job(
    start_worker: Callable[..., WorkerProcess], clean_redis_url: str
) -> None:
    start_worker(concurrency=2)
    async with (
        AsyncClient(clean_redis_url, model="llama-mqa") as owner,
        AsyncClient(clean_redis_url, model="llama-mqa") as observer,
    ):
        async with owner.stream(**JOB) as stream:
            await stream.__anext__()
            watcher = await observer.resume(stream.job_id)
            async with watcher:
                await watcher.__anext__()
            await observer.aclose()  # flushes any abort the observer would send
            done = await stream.final()
    assert len(done.token_ids) == JOB["max_tokens"]
    assert isinstance(wait_terminal(clean_redis_url, stream.job_id)[-1], Finished)
    assert not _abort_flag_set(clean_redis_url, stream.job_id)


async def test_abort_on_exit_cancels_the_resumed_job(
    start_worker: Callable[..., WorkerProcess], clean_redis_url: str
) -> None:
    start_worker(concurrency=2)
    async with AsyncClient(clean_redis_url, model="llama-mqa") as client:
        stream = client.stream(**{**JOB, "max_tokens": 2000})
        await stream.start()
        await stream.__anext__()
        job_id = stream.job_id
        watcher = await client.resume(job_id, abort_on_exit=True)
        async with watcher:
            await watcher.__anext__()
        events = await asyncio.to_thread(wait_terminal, clean_redis_url, job_id)
        await stream.aclose()
    assert isinstance(events[-1], Failed)
    assert events[-1].code == ErrorCode.CANCELLED
    assert _abort_flag_set(clean_redis_url, job_id)
