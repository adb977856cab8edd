"""A worker whose job ended leaves no record of its message, even if it dies at once.

Real Redis (append-only, so a restart keeps its data), a real simulated worker. Redis
stops mid-stream for 3 s: Celery's consumer loses its connection and backs off (2 s,
then 4 s) before it connects again; the job's own writes are held and go on once Redis
is back, and the job ends while the consumer still waits. The worker is SIGKILLed as soon
as the task has returned. kombu's unacknowledged record of the message and the worker's
``celery:delivered`` entry must be gone.

Before, only Celery's acknowledgement removed them, and Celery sends it from its
consumer's loop, which was still backing off: the SIGKILL left both. The live workers'
watch then found a message of a dead worker whose job's record had expired (chaos seed
5, where the log TTL is seconds) and ran the finished job a second time: a second run
wrote the log from seq 0 again, after its terminal event.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers.redis_server import RedisServer
from helpers.worker_process import WorkerProcess

from kvrelay import Client
from kvrelay.keys import Keyspace

pytestmark = pytest.mark.integration

KEYS = Keyspace()
JOB = {"prompt": "a question the simulated engine answers", "max_tokens": 150}


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", durable=True).start()
    try:
        yield server
    finally:
        server.stop()


def _records(client: redis.Redis) -> dict[str, int]:
    return {"unacked": int(client.hlen(KEYS.celery_unacked)),
            "delivered": int(client.hlen(KEYS.celery_delivered))}


def _returned(worker: WorkerProcess, job_id: str, timeout: float = 20.0) -> None:
    """Until the worker logs the task's return (Celery's line, after the task body)."""
    deadline = time.monotonic() + timeout
    while f"[{job_id}] succeeded" not in worker.tail(None):
        assert time.monotonic() < deadline, "the task never returned"
        time.sleep(0.02)


def test_a_job_that_ended_leaves_no_delivery_record_behind_a_death(
        durable_redis: RedisServer, tmp_path: Path) -> None:
    worker = WorkerProcess("short-lived", durable_redis.url, "simulated", tmp_path,
                           concurrency=2, simulated_step_ms=20).start()
    try:
        worker.wait_ready()
        with Client(durable_redis.url, model="simulated", stream_timeout=60) as sdk:
            reference = sdk.generate(**JOB)
            with sdk.stream(**JOB) as stream:
                for count, _ in enumerate(stream, start=1):
                    if count == 20:
                        with redis.Redis.from_url(durable_redis.url) as client:
                            assert _records(client) == {"unacked": 1, "delivered": 1}
                        durable_redis.stop()
                        time.sleep(3.0)
                        durable_redis.start()
                final = stream.final()
                job_id = stream.job_id
        assert final.token_ids == reference.token_ids
        _returned(worker, job_id)
        worker.kill()
        with redis.Redis.from_url(durable_redis.url) as client:
            assert _records(client) == {"unacked": 0, "delivered": 0}, worker.tail(6000)
    finally:
        worker.stop()
