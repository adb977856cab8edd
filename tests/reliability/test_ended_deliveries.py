"""Unacknowledged records of ended jobs are dropped whoever holds them
(``kvrelay_worker.jobs.ended_deliveries``), on a real Redis with kombu's own records.

Chaos seeds 5 and 9219: killing the pub/sub connections makes a worker's consumer
reconnect and restore every message it held; a failover right behind it lost the restore,
and the new primary kept a record of a message (prompt and all) that its live worker
never acknowledged again, after its job had ended. Before: nothing looked at a live
worker's records, and kombu would have restored the message after 6 h. Now: a record
whose job is done (or whose end mark is left once its record expired) goes at the next
watch; one whose job runs stays.
"""

from __future__ import annotations

import json

import pytest
import redis

from kvrelay.keys import Keyspace
from kvrelay_worker.jobs.ended_deliveries import EndedDeliveries
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.settings import WorkerSettings

pytestmark = pytest.mark.integration

KEYS = Keyspace()


def _hold(direct: redis.Redis, tag: str, job_id: str, worker: str | None) -> None:
    """Records as kombu and ``HeldQoS`` write them for a delivered message."""
    message = {"body": "eyJwcm9tcHQiOiAic2VjcmV0In0=", "headers": {"id": job_id},
               "properties": {"delivery_tag": tag, "body_encoding": "base64"}}
    direct.hset(KEYS.celery_unacked, tag, json.dumps([message, "", "kvrelay.m"]))
    direct.zadd(KEYS.celery_unacked_index, {tag: 1.0})
    if worker is not None:
        direct.hset(KEYS.celery_delivered, tag, worker)


def test_records_of_ended_jobs_go_and_running_ones_stay(clean_redis_url: str) -> None:
    direct = redis.Redis.from_url(clean_redis_url)
    store = JobStore(direct, WorkerSettings(redis_url=clean_redis_url, model_name="m"))
    store.scripts.load()
    direct.set(KEYS.worker_heartbeat("alive"), "1", ex=60)
    direct.hset(KEYS.job_record("ended"), mapping={"state": "done"})
    direct.hset(KEYS.job_record("ended-unnamed"), mapping={"state": "done"})
    direct.hset(KEYS.job_record("running"), mapping={"state": "running"})
    direct.set(KEYS.end_mark("expired"), "1", ex=3600)  # ended; its record expired
    _hold(direct, "t-ended", "ended", "alive")
    _hold(direct, "t-expired", "expired", "alive")
    _hold(direct, "t-unnamed", "ended-unnamed", None)
    _hold(direct, "t-running", "running", "alive")
    direct.hset(KEYS.celery_unacked, "t-garbled", b"\xff not json")
    now = [0.0]
    watch = EndedDeliveries(direct, KEYS, store.scripts, clock=lambda: now[0])
    assert watch.sweep() == 3
    assert sorted(direct.hkeys(KEYS.celery_unacked)) == [b"t-garbled", b"t-running"]
    assert direct.zrange(KEYS.celery_unacked_index, 0, -1) == [b"t-running"]
    assert direct.hkeys(KEYS.celery_delivered) == [b"t-running"]
    direct.hset(KEYS.job_record("running"), "state", "done")
    assert watch.sweep() == 0  # read a moment ago: looked at again later, not every watch
    now[0] += 10.0
    assert watch.sweep() == 1
    assert direct.hkeys(KEYS.celery_unacked) == [b"t-garbled"]


def test_the_messages_of_jobs_this_worker_ended_go_with_no_record_left(
        clean_redis_url: str) -> None:
    # Seed 10012: a restart brought back a dead worker's record of a job whose ended
    # record then expired: nothing could tell the job had ended but its last worker.
    direct = redis.Redis.from_url(clean_redis_url)
    store = JobStore(direct, WorkerSettings(redis_url=clean_redis_url, model_name="m"))
    _hold(direct, "t-mine", "ended-here", "dead-worker")
    _hold(direct, "t-other", "elsewhere", "dead-worker")
    watch = EndedDeliveries(direct, KEYS, store.scripts)
    assert watch.drop_jobs({"ended-here"}) == 1
    assert direct.hkeys(KEYS.celery_unacked) == [b"t-other"]
    assert direct.zrange(KEYS.celery_unacked_index, 0, -1) == [b"t-other"]
    assert direct.hkeys(KEYS.celery_delivered) == [b"t-other"]
