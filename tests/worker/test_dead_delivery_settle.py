"""What a live worker does with each message a dead worker took and never acknowledged.

Real Redis, no Celery: kombu's unacknowledged records are written as kombu writes them
(hash of ``[message, exchange, routing key]``, index scored by the time taken) beside the
``celery:delivered`` entry naming the worker. Each case is one job record as a message
can find it; the script reads the record and the lease itself, so a claim that lands
between the watch's reads and its verdict is never undone. Before, the watch read the
state first and gave back a job whose lease a claim had just taken (``j-claiming``), and
gave back the message of a job already requeued (``j-requeued``), or of a job that ended
and whose record expired (``j-expired``): a second copy.
"""

from __future__ import annotations

import json
import time

import redis

from kvrelay.lua_library import LIBRARY
from kvrelay.redis_functions import Functions
from kvrelay_worker.jobs.dead_deliveries import DeadDeliveries
from kvrelay_worker.settings import WorkerSettings

MODEL = "m"
DEAD, ALIVE = "gone:2:b", "busy:3:c"


def _message(job_id: str) -> dict[str, object]:
    body = json.dumps([[{"job_id": job_id, "enqueued_at": 0.0}], {}, {}])
    return {"body": body, "headers": {"id": job_id}, "properties": {"priority": 0}}


def _deliver(client: redis.Redis, settings: WorkerSettings, tag: str, job_id: str,
             worker: str) -> None:
    keys = settings.keys
    raw = json.dumps([_message(job_id), "", keys.celery_queue(MODEL)])
    client.hset(keys.celery_unacked, tag, raw)
    client.zadd(keys.celery_unacked_index, {tag: time.time()})
    client.hset(keys.celery_delivered, tag, worker)


def test_each_record_state_settles_its_message(clean_redis_url: str) -> None:
    client = redis.Redis.from_url(clean_redis_url)
    me = WorkerSettings(redis_url=clean_redis_url, model=MODEL, worker_id="live:1:a")
    keys = me.keys
    client.set(keys.worker_heartbeat(ALIVE), "{}")
    cases = {  # tag: (job id, record fields or None, lease held)
        "t-raw": ("j-raw", None, False),  # sent by a producer that writes no record
        "t-reserved": ("j-reserved", {"digest": "d"}, False),
        "t-requeued": ("j-requeued", {"state": "queued"}, False),
        "t-done": ("j-done", {"state": "done"}, False),
        "t-running": ("j-running", {"state": "running"}, True),
        "t-claiming": ("j-claiming", {"state": "queued"}, True),
        "t-expired": ("j-expired", None, False),  # ended; only its end mark is left
    }
    for tag, (job_id, record, leased) in cases.items():
        _deliver(client, me, tag, job_id, DEAD)
        if record is not None:
            client.hset(keys.job_record(job_id), mapping=record)
        if leased:
            client.set(keys.lease(job_id), "some-run")
    _deliver(client, me, "t-alive", "j-alive", ALIVE)
    client.set(keys.end_mark("j-expired"), "1", ex=3600)

    settled = DeadDeliveries(client, me, Functions(client, LIBRARY)).sweep()

    queued = [json.loads(item) for item in client.lrange(keys.queue(MODEL), 0, -1)]
    given_back = sorted(m["headers"]["id"] for m in queued)
    # A requeued job's copy was pushed by its requeue (and is pushed again by the watch
    # if lost): giving the dead worker's message back too made two copies, and the late
    # one ended the job a second time once its record had expired (chaos seed 10038).
    assert given_back == ["j-raw", "j-reserved"]
    assert all(m["headers"]["redelivered"] is True for m in queued)
    # An ended job whose record expired is known by its end mark: giving its message back
    # ran the job a second time (chaos seed 10055's late copy).
    assert settled == 5  # two given back, three dropped
    left = {tag.decode() for tag in client.hkeys(keys.celery_unacked)}
    # Claimed jobs are the lease takeover's; a live worker's messages are its own.
    assert left == {"t-running", "t-claiming", "t-alive"}
    assert {tag.decode() for tag in client.hkeys(keys.celery_delivered)} == left
    assert {tag.decode() for tag in client.zrange(keys.celery_unacked_index, 0, -1)} == left
    # No queue deadline passed: no record is made for the producer's job.
    assert not client.exists(keys.job_record("j-raw"))
    client.close()
