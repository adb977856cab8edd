"""A taken-over job jumps the queue; jobs whose callers gave up never start.

One real worker (concurrency 1) runs a long greedy job while 200 short jobs queue behind
it, next to jobs whose callers gave up in each way a caller can: it closed its stream
(abort flag), it hit its own ``queue_timeout`` (QueueTimeout, abort flag), or it died
without a word (only the job's ``queue_deadline`` says so). The worker is frozen mid-job,
then SIGKILLed; once its lease has expired a second worker (concurrency 1) starts. It must
take the interrupted job over first (its caller is waiting) and finish it before any queued
job; then every queued job runs (a wider third worker joins so this takes seconds, not
minutes), and none of the abandoned ones starts: their logs hold a ``Failed`` event and no
``Started``.
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
import time
from collections.abc import Callable

import msgspec
import pytest
import redis
from helpers.celery_send import greedy_request, send_requests
from helpers.job_log import read_events, wait_terminal
from helpers.worker_process import WorkerProcess

import kvrelay
from kvrelay import AsyncClient, AsyncStream
from kvrelay.keys import Keyspace
from kvrelay.protocol import ErrorCode, Failed, Finished, Started

KEYS = Keyspace()  # the default namespace

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "llama-mqa"
QUEUED = 200
LONG_TOKENS = 60
# Short failover timings so the test does not wait on defaults meant for production.
LEASES = {"lease_ttl": 2.0, "lease_refresh": 0.5, "watchdog_interval": 0.5}


async def _finish(stream: AsyncStream, done_at: dict[str, float]) -> kvrelay.Completion:
    completion = await stream.final()
    done_at[stream.job_id] = time.monotonic()
    return completion


def _wait_gone(url: str, key: str, timeout: float) -> None:
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + timeout
        while client.exists(key):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{key} still exists after {timeout}s")
            time.sleep(0.05)
    finally:
        client.close()


def _never_started(url: str, job_id: str, code: str) -> None:
    events = wait_terminal(url, job_id, timeout=60)
    assert not any(isinstance(e, Started) for e in events), (job_id, events)
    assert isinstance(events[-1], Failed), (job_id, events)
    assert events[-1].code == code, (job_id, events)


@pytest.mark.timeout(600)  # a hang guard: three worker starts and 200 jobs on 2 shared cores
async def test_taken_over_job_runs_first_and_abandoned_jobs_never_start(
    start_worker: Callable[..., WorkerProcess], clean_redis_url: str
) -> None:
    url = clean_redis_url
    rng = random.Random(16)
    first = start_worker("first", concurrency=1, **LEASES)
    done_at: dict[str, float] = {}
    # require_worker=False: the frozen worker's heartbeat lapses while jobs are queued.
    async with AsyncClient(
        url, model=MODEL, stream_timeout=300, queue_timeout=600, require_worker=False
    ) as client:
        long = client.stream(
            prompt_token_ids=[21, 22, 23, 24, 25],
            max_tokens=LONG_TOKENS,
            temperature=0.0,
            ignore_eos=True,
        )
        await long.start()
        await long.__anext__()
        first.signal(signal.SIGSTOP)  # frozen mid-job: everything below queues behind it
        long_task = asyncio.create_task(_finish(long, done_at))

        queued: list[AsyncStream] = []
        for _ in range(QUEUED):
            stream = client.stream(
                prompt_token_ids=[rng.randrange(10, 500) for _ in range(4)],
                max_tokens=3,
                temperature=0.0,
                ignore_eos=True,
            )
            await stream.start()
            queued.append(stream)
        queued_tasks = [asyncio.create_task(_finish(s, done_at)) for s in queued]

        # Callers that closed their stream while the job waited.
        closed_ids = []
        for _ in range(5):
            stream = client.stream(prompt_token_ids=[7, 8, 9], max_tokens=3)
            await stream.start()
            closed_ids.append(stream.job_id)
            await stream.aclose()
        # Callers whose own queue_timeout ran out.
        impatient = [
            client.stream(prompt_token_ids=[7, 8, 9], max_tokens=3, queue_timeout=0.5)
            for _ in range(5)
        ]
        for stream in impatient:
            await stream.start()
        for stream in impatient:
            with pytest.raises(kvrelay.QueueTimeout):
                await asyncio.wait_for(stream.final(), 30)
        # Callers that died without a word: only the queue deadline speaks for them.
        silent = []
        for _ in range(5):
            request = greedy_request(MODEL, [7, 8, 9], 3)
            silent.append(msgspec.structs.replace(request, queue_deadline=time.time() + 0.5))
        await asyncio.to_thread(send_requests, url, silent)

        first.kill()
        await asyncio.to_thread(_wait_gone, url, KEYS.lease(long.job_id), 30)
        await asyncio.sleep(1.0)  # every silent caller's deadline is long past
        second = await asyncio.to_thread(start_worker, "second", concurrency=1, **LEASES)

        long_done = await asyncio.wait_for(long_task, 120)
        # Ordering is shown; a wider worker drains the rest (sequentially it takes minutes).
        await asyncio.to_thread(start_worker, "drain", concurrency=32, **LEASES)
        completions = await asyncio.wait_for(asyncio.gather(*queued_tasks), 240)

    # The interrupted job was resumed by the new worker and finished before any queued job.
    long_events = read_events(url, long.job_id)
    assert [e.attempt for e in long_events if isinstance(e, Started)] == [1, 2]
    assert [e.seq for e in long_events] == list(range(len(long_events)))
    assert len(long_done.token_ids) == LONG_TOKENS
    first_queued_done = min(done_at[s.job_id] for s in queued)
    assert done_at[long.job_id] < first_queued_done
    received = re.findall(r"kvrelay\.generate\[(\w+)\] received", second.tail(1_000_000))
    assert received[0] == long.job_id  # the new worker popped it before any queued job
    # Every queued job ran to its end.
    assert all(len(c.token_ids) == 3 for c in completions)
    for stream in queued[:: QUEUED // 10]:
        assert isinstance(read_events(url, stream.job_id)[-1], Finished)
    # No abandoned job started, whichever way its caller left.
    for job_id in closed_ids:
        _never_started(url, job_id, ErrorCode.CANCELLED)
    for stream in impatient:
        _never_started(url, stream.job_id, ErrorCode.CANCELLED)
    for request in silent:
        _never_started(url, request.job_id, ErrorCode.QUEUE_TIMEOUT)
