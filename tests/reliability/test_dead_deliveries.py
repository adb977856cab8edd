"""Messages a worker took and died holding are given back within seconds, not 6 hours.

Real Redis, real worker processes (simulated engine, short leases). The first worker takes
eight jobs at once: two it claims and runs, six it never claims (an injected pause just
before the claim: the message is delivered, recorded unacknowledged, and its job never
started). Three of those six have SDK callers waiting; three were sent by callers that
left without a word, with a queue deadline that passes before the worker dies. It is
SIGKILLed; a second worker starts.

- Each unclaimed job is given back to the queue by the live worker's watch within its
  heartbeat TTL plus a watch period, counts as never started (one ``Started``, attempt
  1) and runs although its queue deadline passed meanwhile (it was picked up in time).
  Before: kombu restored them only after its visibility timeout (6 h); the callers hit
  ``QueueTimeout``, and the restored copies of the silent jobs were refused as late.
- The two running jobs are taken over through their leases; once they end, the dead
  worker's unacknowledged records of them are gone. Before: they stayed for 6 h, and
  once the jobs' done records had expired (1 h) kombu's restored copies ran as new jobs
  and wrote a second ending under the same ids.
- Every job ends exactly once, with ``Finished`` and every token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers.celery_send import send_requests
from helpers.injected_faults import FAST, inject
from helpers.job_log import wait_terminal
from helpers.worker_fixtures import stop_and_show_logs
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient, AsyncStream
from kvrelay.keys import Keyspace
from kvrelay.protocol import TERMINAL_EVENTS, Finished, GenerateRequest, SamplingOptions, Started

pytestmark = pytest.mark.integration

KEYS = Keyspace()
MODEL = "simulated"
TOKENS = 40
RUN, HOLD_SDK, HOLD_SILENT = 2, 3, 3
# When the dead worker's messages must be back: its heartbeat's TTL (3 s at these
# settings), a watch period, a claim, and room for two shared cores.
HEARTBEAT_TTL_S = 3.0
GIVEN_BACK_WITHIN_S = HEARTBEAT_TTL_S + FAST["watchdog_interval"] + 6.0


@pytest.fixture
def workers(clean_redis_url: str, tmp_path: Path, request: pytest.FixtureRequest
            ) -> Iterator[Callable[..., WorkerProcess]]:
    """``start(name, settings, **faults)``: a simulated worker with ``FAST`` settings."""
    started: list[WorkerProcess] = []

    def start(name: str, settings: dict[str, Any], **faults: str) -> WorkerProcess:
        worker = inject(WorkerProcess(name, clean_redis_url, MODEL, tmp_path,
                                      **(FAST | settings)), **faults)
        started.append(worker.start())
        return worker.wait_ready()

    yield start
    stop_and_show_logs(started, request, 8000)


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout}s")
        time.sleep(0.05)


async def _first_chunk_then_final(stream: AsyncStream, first_at: dict[str, float]) -> Any:
    async for _chunk in stream:
        first_at.setdefault(stream.job_id, time.monotonic())
    return await stream.final()


@pytest.mark.timeout(240)
async def test_a_dead_workers_unclaimed_messages_are_given_back_and_its_records_dropped(
        workers: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    url = clean_redis_url
    admin = redis.Redis.from_url(url)
    first = workers("first", {"concurrency": RUN + HOLD_SDK + HOLD_SILENT},
                    pause_claim_of="hold-")
    first_at: dict[str, float] = {}
    async with AsyncClient(url, model=MODEL, stream_timeout=40, require_worker=False) as client:
        running = [client.stream(prompt=f"running job {i}", max_tokens=TOKENS * 5,
                                 ignore_eos=True, job_id=f"run-{i}") for i in range(RUN)]
        for stream in running:
            await stream.start()
            await asyncio.wait_for(stream.__anext__(), 20)  # claimed and streaming
        held = [client.stream(prompt=f"held job {i}", max_tokens=TOKENS, ignore_eos=True,
                              job_id=f"hold-sdk-{i}", queue_timeout=15) for i in range(HOLD_SDK)]
        for stream in held:
            await stream.start()
        silent = [GenerateRequest(job_id=f"hold-silent-{i}", model=MODEL, prompt=f"silent {i}",
                                  sampling=SamplingOptions(max_tokens=TOKENS, ignore_eos=True),
                                  enqueued_at=time.time(), queue_deadline=time.time() + 1.0)
                  for i in range(HOLD_SILENT)]
        await asyncio.to_thread(send_requests, url, silent)
        # The first worker has taken every message (the held ones wait before their claim).
        await asyncio.to_thread(_wait, lambda: admin.hlen(KEYS.celery_unacked) == 8, 20,
                                "eight unacknowledged messages")
        await asyncio.sleep(max(0.0, silent[-1].queue_deadline - time.time()))  # type: ignore[operator]
        tasks = [asyncio.create_task(_first_chunk_then_final(s, first_at))
                 for s in running + held]
        first.kill()
        second = await asyncio.to_thread(workers, "second", {"concurrency": 8})
        ready_at = time.monotonic()
        completions = await asyncio.wait_for(asyncio.gather(*tasks), 60)

    for completion in completions:
        assert len(completion.token_ids) in (TOKENS, TOKENS * 5)
        assert completion.choices[0].finish_reason == "length"
    for stream in held:  # given back soon after the death showed
        assert first_at[stream.job_id] - ready_at < GIVEN_BACK_WITHIN_S, first_at
    for request in silent:
        events = await asyncio.to_thread(wait_terminal, url, request.job_id, 30)
        assert isinstance(events[-1], Finished), events[-1]
    for job_id in [s.job_id for s in running + held] + [r.job_id for r in silent]:
        events = await asyncio.to_thread(wait_terminal, url, job_id, 30)
        assert [e.seq for e in events] == list(range(len(events))), job_id
        assert sum(isinstance(e, TERMINAL_EVENTS) for e in events) == 1, job_id
        attempts = [e.attempt for e in events if isinstance(e, Started)]
        assert attempts == ([1, 2] if job_id.startswith("run-") else [1]), (job_id, attempts)
    # No record of the dead worker's messages is left for kombu to restore 6 h later.
    await asyncio.to_thread(
        _wait, lambda: admin.hlen(KEYS.celery_unacked) == 0 and
        admin.zcard(KEYS.celery_unacked_index) == 0 and
        admin.hlen(KEYS.celery_delivered) == 0, 10, "no unacknowledged record left")
    assert "gave its message back" in second.tail(1_000_000)
    admin.close()
