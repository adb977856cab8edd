"""A worker process's runtime in-process: one connection pool, one registry of held jobs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from helpers.celery_send import greedy_request
from helpers.engine_run import one_torch_thread
from helpers.job_log import read_events
from helpers.redis_db import fresh_db_url

from kvrelay import event_log
from kvrelay.event_frames import pack_events
from kvrelay.keys import Keyspace
from kvrelay.protocol import (
    ErrorCode,
    Failed,
    Finished,
    Tokens,
    encode_event,
    request_to_payload,
)
from kvrelay_worker.runtime import WorkerRuntime
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()  # the default namespace

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime(redis_url: str, tiny_model_path: str) -> Iterator[WorkerRuntime]:
    # A database of its own, so every connection on it is this worker's or the probe's.
    url = fresh_db_url(redis_url, 13)
    settings = WorkerSettings(redis_url=url, model=tiny_model_path, model_name="tiny",
                              device="cpu", concurrency=2, enable_cuda_graphs=False,
                              lease_ttl=2.0, lease_refresh=0.2, watchdog_interval=0.2)
    with one_torch_thread():
        worker = WorkerRuntime(settings, requeue=lambda job_id, payload: None)
        worker.start()
        try:
            yield worker
        finally:
            worker.shutdown(grace=1.0)


def test_every_thread_borrows_from_the_one_connection_pool(runtime: WorkerRuntime) -> None:
    request = greedy_request("tiny", [5, 6, 7], 4)
    assert runtime.run_job(request.job_id, request_to_payload(request)) == "finished"
    assert isinstance(read_events(runtime.settings.redis_url, request.job_id)[-1], Finished)

    pool = runtime.redis.connection_pool
    clients = [runtime.store.redis, runtime.publisher.store.redis, runtime.leases.store.redis,
               runtime.failover.store.redis, runtime.heartbeat.redis, runtime.control.redis]
    assert all(client.connection_pool is pool for client in clients)

    probe = redis.Redis.from_url(runtime.settings.redis_url, client_name="probe")
    try:
        db = probe.connection_pool.connection_kwargs["db"]
        names = [c["name"] for c in probe.client_list() if int(c["db"]) == db]
    finally:
        probe.close()
    worker_name = f"kvrelay-worker:{runtime.settings.worker_id}"
    assert sorted(set(names)) == sorted({worker_name, "probe"}), names
    # Pub/sub (control) plus the command connections the threads hold at once.
    assert 2 <= names.count(worker_name) <= 6, names


def test_a_held_job_leaves_the_registry_and_its_lease_when_it_ends(
        runtime: WorkerRuntime) -> None:
    request = greedy_request("tiny", [5, 6, 7], 3)
    assert runtime.run_job(request.job_id, request_to_payload(request)) == "finished"
    assert runtime.jobs.ids() == []
    assert runtime.redis.hget(KEYS.job_record(request.job_id), "state") == b"done"
    assert not runtime.redis.exists(KEYS.lease(request.job_id))
    assert runtime.redis.zcard(runtime.store.running_key) == 0


def test_a_takeover_of_a_log_that_lost_its_start_fails_log_truncated(
        runtime: WorkerRuntime) -> None:
    request = greedy_request("tiny", [5, 6, 7], 8)
    # What a dead worker left: a log whose first entries were trimmed away.
    for seq in (3, 4, 5):
        token = Tokens(seq=seq, token_ids=[seq], text="x")
        event_log.add_entry(runtime.redis, KEYS.event_log(request.job_id), seq,
                            pack_events([encode_event(token)]))
    assert runtime.run_job(request.job_id, request_to_payload(request)) == "failed"
    events = read_events(runtime.settings.redis_url, request.job_id)
    assert [e.seq for e in events] == [3, 4, 5, 6]
    failed = events[-1]
    assert isinstance(failed, Failed)
    assert failed.code == ErrorCode.LOG_TRUNCATED
    assert runtime.redis.hget(KEYS.job_record(request.job_id), "state") == b"done"
