"""A resume whose job's log expires while the stream is being opened is answered at once.

Chaos seed 333's path, made deterministic with real Redis and a real worker (simulated
engine, ``KVRELAY_LOG_TTL=3``): five jobs finish; shortly before their logs expire,
``CLIENT PAUSE WRITE`` holds every write for three seconds and five callers resume them.
The existence check (reads) finds each job; the stream's watch (a write) waits out the
pause, and by then the log and the record are gone. Before, the stream then waited for
live events that could not come and ended in ``StreamTimeout``. Now the resume reads the
job's record and log together when its replay found nothing, and answers ``UnknownJob``
at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers.injected_faults import FAST
from helpers.worker_process import WorkerProcess

import kvrelay
from kvrelay import AsyncClient
from kvrelay.keys import Keyspace

pytestmark = pytest.mark.integration

KEYS = Keyspace()
MODEL = "simulated"
JOBS = 5
LOG_TTL_S = 3
PAUSE_S = 3.0
STREAM_TIMEOUT_S = 8.0


@pytest.fixture
def worker(clean_redis_url: str, tmp_path: Path, request: pytest.FixtureRequest
           ) -> Iterator[WorkerProcess]:
    started = WorkerProcess("w", clean_redis_url, MODEL, tmp_path,
                            **(FAST | {"log_ttl": LOG_TTL_S})).start()
    try:
        yield started.wait_ready()
    finally:
        started.stop()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(f"\n----- worker log -----\n{started.tail(6000)}")


async def _resume_to_the_end(client: AsyncClient, job_id: str) -> float:
    """Seconds until ``UnknownJob`` (from ``resume`` or from the stream)."""
    started = time.monotonic()

    async def resume_and_read() -> None:
        stream = await client.resume(job_id, after_seq=0)
        await stream.final()

    with pytest.raises(kvrelay.UnknownJob):
        await resume_and_read()
    return time.monotonic() - started


@pytest.mark.timeout(120)
async def test_a_resume_whose_log_expires_meanwhile_is_answered_at_once(
        worker: WorkerProcess, clean_redis_url: str) -> None:
    admin = redis.Redis.from_url(clean_redis_url)
    async with AsyncClient(clean_redis_url, model=MODEL, stream_timeout=STREAM_TIMEOUT_S,
                           reconnect_timeout=2 * PAUSE_S) as client:
        streams = [client.stream(prompt=f"short job {i}", max_tokens=4) for i in range(JOBS)]
        for stream in streams:
            await stream.final()
        ended_at = time.monotonic()
        job_ids = [stream.job_id for stream in streams]
        assert all(admin.exists(KEYS.event_log(j)) for j in job_ids)
        # The logs have a second or so left when the writes stop.
        await asyncio.sleep(max(0.0, ended_at + LOG_TTL_S - 1.2 - time.monotonic()))
        admin.execute_command("CLIENT", "PAUSE", int(PAUSE_S * 1000), "WRITE")
        took = await asyncio.wait_for(
            asyncio.gather(*[_resume_to_the_end(client, j) for j in job_ids]), 60)
    assert not any(admin.exists(KEYS.event_log(j)) for j in job_ids)
    # Answered once the pause let the watch through, not after the stream timeout.
    assert max(took) < PAUSE_S + 2.0 < STREAM_TIMEOUT_S, took
    admin.close()
