"""Redis restarts under a running worker: the worker reconnects and keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.redis_server import RedisServer
from helpers.worker_process import WorkerProcess

from kvrelay import Client

pytestmark = pytest.mark.integration

JOB = {"prompt_token_ids": [71, 72, 73], "max_tokens": 16, "temperature": 0.0,
       "ignore_eos": True}


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


def test_worker_survives_a_redis_restart(own_redis: RedisServer, tiny_model_path: str,
                                         tmp_path: Path) -> None:
    worker = WorkerProcess("steadfast", own_redis.url, tiny_model_path, tmp_path,
                           concurrency=4).start()
    try:
        worker.wait_ready()
        with Client(own_redis.url, model="llama-mqa") as client:
            before = client.generate(**JOB).token_ids
        own_redis.restart()  # a Redis without persistence comes back empty
        worker.wait_for_stats(lambda s: True, timeout=60)  # the heartbeat is back
        with Client(own_redis.url, model="llama-mqa", stream_timeout=60) as client:
            after = client.generate(**JOB).token_ids
        assert after == before
        assert worker.alive()
    finally:
        worker.stop()




def test_a_stream_survives_a_redis_restart_that_loses_its_job(own_redis: RedisServer,
                                                              tmp_path: Path) -> None:
    """Redis comes back empty mid-stream (no persistence): the job's record and lease are
    gone. The worker's next lease refresh finds the record vanished and registers the job
    again, and the stream goes on to its end. Before, that refresh reported the lease lost
    and the worker stopped a job nobody else would run: the caller waited for nothing."""
    worker = WorkerProcess("steadfast", own_redis.url, "simulated", tmp_path, concurrency=4,
                           simulated_step_ms=20, lease_ttl=2.0, lease_refresh=0.5,
                           watchdog_interval=0.5).start()
    try:
        worker.wait_ready()
        with Client(own_redis.url, model="simulated", stream_timeout=30) as client:
            job = {"prompt": "a question the simulated engine answers", "max_tokens": 250}
            reference = client.generate(**job)
            with client.stream(**job) as stream:
                for count, _ in enumerate(stream, start=1):
                    if count == 20:
                        own_redis.restart()
                final = stream.final()
        assert final.token_ids == reference.token_ids
        assert final.finish_reason == "length"
        assert worker.alive()
        assert "registered it again" in worker.tail(20_000)
    finally:
        worker.stop()
