"""A job left ``queued`` whose copy never arrived is pushed again: nothing waits on a
record nobody will touch.

Real Redis, real worker processes (simulated engine, short leases). The first worker runs
six long jobs and is told to stop (SIGTERM) with a short grace: it hands each job back,
setting its record ``queued`` and pushing a copy, and acknowledges its own message; every
one of those copies is lost on its way (an injected fault: as pushes to a primary that is
then demoted). Before, nothing looked at a ``queued`` record again (the hand-back and
``COMMIT_REQUEUE`` took the job out of the running set) and every caller ended in
``StreamTimeout``. Now the job stays in the running set, due a lease later; the second
worker's watch finds no copy anywhere and pushes one, and every stream completes: each
job ends once, with every token, resumed by one more run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.injected_faults import FAST, inject
from helpers.job_log import wait_terminal
from helpers.worker_fixtures import stop_and_show_logs
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient, AsyncStream
from kvrelay.protocol import TERMINAL_EVENTS, Finished, Started

pytestmark = pytest.mark.integration

MODEL = "simulated"
JOBS = 6
TOKENS = 500
# Lease expiry and takeover, the copy's due time (a lease), a watch period, the resumed
# run, with room for two shared cores: well inside the callers' stream timeout.
STREAM_TIMEOUT_S = 30.0


@pytest.fixture
def workers(clean_redis_url: str, tmp_path: Path, request: pytest.FixtureRequest
            ) -> Iterator[Callable[..., WorkerProcess]]:
    """``start(name, **faults)``: a simulated worker with ``FAST`` settings, 8 slots and
    a short grace at shutdown."""
    started: list[WorkerProcess] = []

    def start(name: str, **faults: str) -> WorkerProcess:
        settings = FAST | {"concurrency": 8, "shutdown_grace": 0.3}
        worker = inject(WorkerProcess(name, clean_redis_url, MODEL, tmp_path, **settings),
                        **faults)
        started.append(worker.start())
        return worker.wait_ready()

    yield start
    stop_and_show_logs(started, request, 8000)


async def _read_all(stream: AsyncStream) -> Any:
    async for _chunk in stream:
        pass
    return await stream.final()


@pytest.mark.timeout(180)
async def test_a_lost_requeue_copy_is_pushed_again(
        workers: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    url = clean_redis_url
    first = workers("first", lose_copies=str(JOBS))
    async with AsyncClient(url, model=MODEL, stream_timeout=STREAM_TIMEOUT_S,
                           require_worker=False) as client:
        streams = [client.stream(prompt=f"job {i} that outlives its worker", max_tokens=TOKENS,
                                 ignore_eos=True) for i in range(JOBS)]
        for stream in streams:
            await stream.start()
        for stream in streams:
            await asyncio.wait_for(stream.__anext__(), 20)
        second = await asyncio.to_thread(workers, "second")
        stopped_at = time.monotonic()
        await asyncio.to_thread(first.stop)  # hands every job back; the copies are lost
        completions = await asyncio.wait_for(
            asyncio.gather(*[_read_all(s) for s in streams]), 90)
        took = time.monotonic() - stopped_at

    assert all(len(c.token_ids) == TOKENS for c in completions)
    for stream in streams:
        events = await asyncio.to_thread(wait_terminal, url, stream.job_id, 30)
        assert [e.seq for e in events] == list(range(len(events))), stream.job_id
        assert sum(isinstance(e, TERMINAL_EVENTS) for e in events) == 1
        assert isinstance(events[-1], Finished)
        # The first run, then the run of the copy pushed again (the lost one never ran).
        assert [e.attempt for e in events if isinstance(e, Started)] == [1, 2]
    assert first.tail(1_000_000).count("test fault: lost job copy") == JOBS
    assert second.tail(1_000_000).count("no copy of it waits anywhere; pushing one") == JOBS
    assert took < STREAM_TIMEOUT_S, took
