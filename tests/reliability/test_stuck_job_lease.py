"""A held job that stops moving keeps no lease; one that waits its turn keeps it.

A worker runtime in this process (simulated engine, real Redis, its real threads).
While the engine's steps go round, every job the engine holds is moving, whether it
runs or waits in the engine's queue, so its lease is kept. Then one engine step never
returns (the step is made to block, as a hung kernel would): within the stall timeout
the lease keeper stops refreshing that job's lease, so it expires in Redis and another
worker's watch would take the job over. Before, the lease keeper refreshed every held
job regardless, and such a stream hung for good.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from kvrelay.keys import Keyspace
from kvrelay.protocol import GenerateRequest, SamplingOptions, request_to_payload
from kvrelay_worker.runtime import WorkerRuntime
from kvrelay_worker.settings import WorkerSettings

pytestmark = pytest.mark.integration

KEYS = Keyspace()


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.02)
    raise TimeoutError(what)


def test_a_job_whose_engine_step_never_returns_lets_its_lease_go(clean_redis_url: str) -> None:
    settings = WorkerSettings(redis_url=clean_redis_url, model="simulated", concurrency=1,
                              max_num_seqs=1, simulated_step_ms=20, lease_ttl=1.0,
                              lease_refresh=0.2, stall_timeout=1.5)
    runtime = WorkerRuntime(settings, requeue=lambda job_id, payload: None)
    runtime.start()
    client = redis.Redis.from_url(clean_redis_url)
    release = threading.Event()
    try:
        jobs = []
        for job_id in ("runs", "waits"):  # one sequence at a time: the second waits
            request = GenerateRequest(job_id=job_id, model=settings.served_model,
                                      prompt_token_ids=[1, 2, 3],
                                      sampling=SamplingOptions(max_tokens=100_000),
                                      enqueued_at=time.time())
            thread = threading.Thread(target=runtime.run_job,
                                      args=(job_id, request_to_payload(request)), daemon=True)
            thread.start()
            jobs.append(thread)
        _wait(lambda: client.xlen(KEYS.event_log("runs")) > 0 or
              client.exists(runtime.store.tail_key) == 1, 20, "the job never started")
        time.sleep(3 * settings.stall_timeout)  # steps go round: both leases are kept
        for job_id in ("runs", "waits"):
            assert client.pttl(KEYS.lease(job_id)) > 0, job_id

        real_step = runtime.engine.step

        def step_that_never_returns() -> Any:
            release.wait()
            return real_step()

        runtime.engine.step = step_that_never_returns  # type: ignore[method-assign]
        gone_after = _wait(lambda: not client.exists(KEYS.lease("runs")), 15,
                           "the stuck job's lease was still refreshed")
        assert gone_after < settings.stall_timeout + settings.lease_ttl + 2.0
        assert runtime.store.check_expired("runs")[0] == "requeue"  # a watch takes it over
    finally:
        release.set()
        runtime.shutdown(grace=0)
        client.close()
