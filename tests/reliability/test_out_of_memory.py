"""Writes a full Redis refuses (``maxmemory`` + ``noeviction``) are never taken as written.

Against a private redis-server whose memory is filled up: a refused script is refused
whole (before, ``RELEASE_DONE`` dropped the lease and then failed to mark the job done),
and the publisher keeps a refused terminal event, and its job, until Redis takes it
(before, the job was finished as if the event had been written). Both fail on the code
before the fix.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import redis
from helpers.redis_server import RedisServer

from kvrelay.keys import Keyspace
from kvrelay.protocol import Finished, GenerateRequest, Usage
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.jobs.active_job import ActiveJob, Outcome
from kvrelay_worker.jobs.job_store import JobStore, PriorProgress
from kvrelay_worker.jobs.publisher import EventItem, Publisher
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()  # the default namespace


class FullRedis:
    """A client of a private server, and a ballast that fills its memory on demand."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url)

    def fill(self) -> None:
        """2 MiB of ballast, then a limit 1 MiB under what is used: every write that
        could need memory is refused until the ballast goes."""
        chunk = b"x" * 256 * 1024
        for i in range(8):
            self.client.set(f"ballast:{i}", chunk)
        used = int(self.client.info("memory")["used_memory"])
        self.client.config_set("maxmemory-policy", "noeviction")
        self.client.config_set("maxmemory", used - 1024 * 1024)
        with pytest.raises(redis.OutOfMemoryError):
            self.client.set("probe", b"1")

    def drain(self) -> None:
        self.client.delete(*self.client.keys("ballast:*"))


@pytest.fixture
def full_redis(redis_server_factory: Callable[[], RedisServer]) -> Iterator[FullRedis]:
    server = redis_server_factory()
    full = FullRedis(server.url)
    yield full
    full.client.close()


def _store(url: str) -> JobStore:
    return JobStore(redis.Redis.from_url(url), WorkerSettings(redis_url=url, model_name="m"))


def test_a_refused_script_changes_nothing(full_redis: FullRedis) -> None:
    store = _store(full_redis.url)
    assert store.claim("j", '{"prompt": "p"}', "digest").status == "claimed"
    full_redis.fill()
    with pytest.raises(redis.OutOfMemoryError):
        store.release_done("j")
    # Nothing of it happened: the job is still this worker's and still running.
    assert store.redis.get(KEYS.lease("j")) == store.worker_id.encode()
    assert store.redis.hget(KEYS.job_record("j"), "state") == b"running"
    full_redis.drain()
    assert store.release_done("j")
    assert store.redis.hget(KEYS.job_record("j"), "state") == b"done"


def test_a_script_is_refused_whole_not_after_its_first_writes(full_redis: FullRedis) -> None:
    # RELEASE_HANDBACK drops the lease (a write that frees memory, allowed when full)
    # before it marks the job queued: only a flagged script is refused before it starts.
    store = _store(full_redis.url)
    assert store.claim("j", '{"prompt": "p"}', "digest").status == "claimed"
    assert store.mark_handback("j")
    full_redis.fill()
    with pytest.raises(redis.OutOfMemoryError):
        store.release_handback("j")
    assert store.redis.get(KEYS.lease("j")) == store.worker_id.encode()
    assert store.redis.hget(KEYS.job_record("j"), "state") == b"running"


def test_a_refused_terminal_event_waits_until_it_is_written(full_redis: FullRedis) -> None:
    store = _store(full_redis.url)
    request = GenerateRequest(job_id="j", model="m", prompt_token_ids=[1, 2])
    job = ActiveJob(job_id="j", request=request, payload_json="{}",
                    params=SamplingParams(max_tokens=4), prompt_ids=[1, 2], attempt=1,
                    prior=PriorProgress())
    store.redis.set(KEYS.lease("j"), store.worker_id)
    publisher = Publisher(store, WorkerMetrics("m"), requeue=lambda job_id, payload: None,
                          on_fenced=lambda job: None)
    publisher.start()
    try:
        full_redis.fill()
        finished = Finished(seq=0, finish_reason="stop",
                            usage=Usage(prompt_tokens=2, completion_tokens=0))
        publisher.put([EventItem(job, finished, Outcome.FINISHED)])
        assert not job.done.wait(1.0), "finished although its event was refused"
        assert store.redis.xlen(KEYS.event_log("j")) == 0
        full_redis.drain()
        assert job.done.wait(10.0)
        assert job.outcome == Outcome.FINISHED
        assert store.redis.xlen(KEYS.event_log("j")) == 1
    finally:
        publisher.stop()
        time.sleep(0)
