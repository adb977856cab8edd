"""A job's prompt never travels in Celery's message headers, first copy or requeued one.

Celery copies a task's arguments as text into the ``argsrepr`` header, which Flower and
``celery events`` show and keep; requeued copies (failover, hand-back) used to carry the
whole prompt there. Real Redis, real Celery producers; the raw message is read back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import redis

from kvrelay.enqueue import CeleryEnqueuer
from kvrelay.keys import Keyspace
from kvrelay.protocol import GenerateRequest, SamplingOptions, encode_request
from kvrelay_worker.app import make_celery
from kvrelay_worker.jobs.job_copy import send_job_copy
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()  # the default namespace

MODEL = "headers-model"
SECRET = "the secret prompt of a tenant"


def request(job_id: str) -> GenerateRequest:
    return GenerateRequest(job_id=job_id, model=MODEL, prompt=SECRET,
                           sampling=SamplingOptions(max_tokens=4), enqueued_at=time.time())


def queued_messages(url: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    try:
        return [json.loads(raw) for raw in client.lrange(KEYS.queue(MODEL), 0, -1)]
    finally:
        client.close()


def assert_prompt_only_in_body(message: dict[str, Any]) -> None:
    headers = message["headers"]
    assert SECRET not in json.dumps(headers), headers
    assert SECRET in base64.b64decode(message["body"]).decode(), "the body carries the job"


def test_the_sdk_keeps_the_prompt_out_of_headers(clean_redis_url: str) -> None:
    async def send() -> None:
        enqueuer = CeleryEnqueuer(clean_redis_url)
        try:
            await enqueuer(request("sdk-job"))
        finally:
            await enqueuer.aclose()

    asyncio.run(send())
    [message] = queued_messages(clean_redis_url)
    assert message["headers"]["id"] == "sdk-job"
    assert_prompt_only_in_body(message)


def test_a_requeued_copy_keeps_the_prompt_out_of_headers(clean_redis_url: str) -> None:
    app = make_celery(WorkerSettings(redis_url=clean_redis_url, model_name=MODEL))
    try:
        send_job_copy(app, KEYS.queue(MODEL), "requeued-job",
                      encode_request(request("requeued-job")).decode())
    finally:
        app.close()
    [message] = queued_messages(clean_redis_url)
    assert message["headers"]["id"] == "requeued-job"
    assert_prompt_only_in_body(message)
