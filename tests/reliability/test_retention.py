"""Retention: once a job ended, Redis keeps no prompt, and nothing longer than its log but
its end mark (its id alone, an hour).

Fails on the code before the fix: a finished job's record lived 7 days (its log 1 h), and
a job that lost all its workers kept its whole payload (the prompt) in the record.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
import redis
from helpers.celery_send import send_requests
from helpers.job_log import wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay.job_script_helpers import END_MARK_TTL_S
from kvrelay.keys import Keyspace
from kvrelay.protocol import Finished, GenerateRequest, SamplingOptions
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()  # the default namespace

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
MARKER = b"retention-marker"


def _values(client: redis.Redis, key: bytes) -> list[bytes]:
    kind = client.type(key).decode()
    if kind == "string":
        return [client.get(key) or b""]
    if kind == "hash":
        return [v for pair in client.hgetall(key).items() for v in pair]
    if kind == "list":
        return list(client.lrange(key, 0, -1))
    if kind == "set":
        return list(client.smembers(key))
    if kind == "zset":
        return list(client.zrange(key, 0, -1))
    if kind == "stream":
        return [v for _, fields in client.xrange(key) for pair in fields.items() for v in pair]
    return []


def _keys_holding_the_prompt(client: redis.Redis) -> list[bytes]:
    return [k for k in client.keys("*") if any(MARKER in v for v in _values(client, k))]


def test_ended_jobs_keep_no_prompt_and_nothing_past_the_log_ttl(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    log_ttl = 3
    start_worker("w", concurrency=4, log_ttl=log_ttl)
    client = redis.Redis.from_url(clean_redis_url)
    try:
        baseline = set(client.keys("*"))
        requests = [GenerateRequest(job_id=uuid.uuid4().hex, model=MODEL,
                                    prompt=f"{MARKER.decode()} {i}",
                                    sampling=SamplingOptions(max_tokens=4, temperature=0.0),
                                    enqueued_at=time.time()) for i in range(6)]
        send_requests(clean_redis_url, requests)
        for request in requests:
            assert isinstance(wait_terminal(clean_redis_url, request.job_id, 120)[-1], Finished)
        # Acknowledged right after the terminal event: then nothing holds a prompt.
        deadline = time.monotonic() + 10
        while _keys_holding_the_prompt(client) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _keys_holding_the_prompt(client) == []
        time.sleep(log_ttl + 1.5)
        # Past the log's TTL only each job's end mark is left: its id alone, for an hour,
        # so that a late copy of its message is dropped (``Keyspace.end_mark``).
        marks = {KEYS.end_mark(r.job_id).encode() for r in requests}
        assert set(client.keys("*")) - baseline == marks
        for mark in marks:
            assert client.get(mark) == b"1"
            assert 0 < client.ttl(mark) <= END_MARK_TTL_S
    finally:
        client.close()


def test_a_job_failed_for_lost_workers_keeps_no_prompt(clean_redis_url: str) -> None:
    client = redis.Redis.from_url(clean_redis_url)
    store = JobStore(client, WorkerSettings(redis_url=clean_redis_url, model_name="m",
                                            max_attempts=1, log_ttl=30))
    try:
        assert store.claim("j", '{"prompt": "retention-marker"}', "d").status == "claimed"
        client.delete(KEYS.lease("j"))  # the worker died: its lease expired
        # The payload comes back once (the failure is published on its client's channel)
        # and is gone from Redis.
        assert store.check_expired("j")[:2] == ("exhausted", '{"prompt": "retention-marker"}')
        assert _keys_holding_the_prompt(client) == []
        assert 0 < client.ttl(KEYS.job_record("j")) <= 30
    finally:
        client.close()
