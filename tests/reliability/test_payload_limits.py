"""Payload size is bounded before the message is parsed, at every layer.

- Redis: ``kvrelay up``'s private server and compose.yaml set ``proto-max-bulk-len``
  (4x the workers' payload limit): a larger value is refused before Redis stores it
  (the default is 512 MiB).
- Worker: a task message whose raw body is over the limit gets its ``Failed``
  (``payload_too_large``) without being JSON-decoded. Before, Celery decoded the whole
  body first: an oversized body that is not JSON died in the decoder, acknowledged,
  and its caller heard nothing.
- SDK: ``max_payload_bytes`` past the default goes only as far as the model's workers
  advertise in their heartbeat; before, a raised client limit sent the job anyway.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import yaml
from celery import Celery
from helpers.celery_send import greedy_request, send_requests
from helpers.job_log import read_events, wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient, PayloadTooLarge, PromptTooLong
from kvrelay.cli.redis_server import PrivateRedis, proto_max_bulk_len
from kvrelay.cli.stack import LocalStack
from kvrelay.cli.worker_launch import WorkerPlan
from kvrelay.keys import Keyspace
from kvrelay.protocol import DEFAULT_MAX_PAYLOAD_BYTES, TASK_NAME, Failed, Finished

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MODEL = "llama-mqa"
MiB = 1 << 20


def _bulk_len(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.config_get("proto-max-bulk-len")["proto-max-bulk-len"])
    finally:
        client.close()


def test_private_redis_refuses_values_over_the_bound(tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path / "redis").start()
    try:
        assert _bulk_len(server.url) == proto_max_bulk_len() == 4 * MiB
        client = redis.Redis.from_url(server.url)
        try:
            client.set("fits", b"x" * (4 * MiB))
            with pytest.raises(redis.RedisError):  # Redis drops the connection
                client.set("too-big", b"x" * (4 * MiB + 1))
        finally:
            client.close()
        # A fresh connection: the refused one may still be half closed on the client's side
        # (Redis answers with a protocol error, then resets the socket).
        checker = redis.Redis.from_url(server.url)
        try:
            assert checker.exists("fits")
            assert not checker.exists("too-big")
        finally:
            checker.close()
    finally:
        server.stop()


def test_kvrelay_up_sizes_the_bound_from_the_workers_limit(tmp_path: Path) -> None:
    plan = WorkerPlan(env={"KVRELAY_MAX_PAYLOAD_BYTES": str(3 * MiB)}, argv=[], model=MODEL,
                      served_model=MODEL, concurrency=1)
    stack = LocalStack([plan], tmp_path)
    url = stack.start_redis(None)
    try:
        assert _bulk_len(url) == 12 * MiB
    finally:
        assert stack.redis is not None
        stack.redis.stop()


def test_compose_redis_sets_the_same_bound() -> None:
    compose = yaml.safe_load((REPO / "compose.yaml").read_text(encoding="utf-8"))
    command = compose["services"]["redis"]["command"]
    value = command[command.index("--proto-max-bulk-len") + 1]
    number, unit = re.fullmatch(r"(\d+)(mb|kb|)", value).groups()  # type: ignore[union-attr]
    assert int(number) * {"mb": MiB, "kb": 1024, "": 1}[unit] == proto_max_bulk_len(
        DEFAULT_MAX_PAYLOAD_BYTES)


def _publish_raw_body(url: str, job_id: str, body: bytes) -> None:
    """A task message exactly as Celery frames it, but with ``body`` as its raw body."""
    app = Celery(broker=url)
    queue = Keyspace().celery_queue(MODEL)
    try:
        message = app.amqp.as_task_v2(job_id, TASK_NAME, args=[{}])
        with app.producer_or_acquire() as producer:
            producer.publish(body, exchange="", routing_key=queue, headers=message.headers,
                             content_type="application/json", content_encoding="utf-8",
                             **message.properties)
    finally:
        app.close()


@pytest.mark.timeout(180)
def test_worker_refuses_an_oversized_message_without_parsing_it(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    worker = start_worker("gate")
    # 2 MiB that no JSON decoder would get through ("[" x 2 Mi: nesting, then EOF).
    _publish_raw_body(clean_redis_url, "oversized", b"[" * (2 * MiB))
    events = wait_terminal(clean_redis_url, "oversized", timeout=30)
    assert isinstance(events[-1], Failed)
    assert events[-1].code == "payload_too_large"
    assert "bytes" in events[-1].message
    # The worker is fine and keeps serving.
    assert worker.alive()
    request = greedy_request(MODEL, [4, 5, 6], max_tokens=3)
    send_requests(clean_redis_url, [request])
    assert isinstance(wait_terminal(clean_redis_url, request.job_id, timeout=60)[-1], Finished)


@pytest.mark.timeout(180)
async def test_sdk_limit_stops_at_what_workers_advertise(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    worker = start_worker("advertiser", max_payload_bytes=3 * MiB)
    assert worker.info() is not None
    async with AsyncClient(clean_redis_url, model=MODEL,
                           max_payload_bytes=16 * MiB) as client:
        too_big = [12345] * 700_000  # ~4.2 MB of JSON: over the advertised 3 MiB
        with pytest.raises(PayloadTooLarge, match="accept at most 3145728") as refused:
            await client.generate(prompt_token_ids=too_big, max_tokens=1)
        job_id = refused.value.job_id
        assert job_id is not None
        assert read_events(clean_redis_url, job_id) == []  # never reached a worker
        assert await client.queue_length() == 0
        # Within what the worker advertises (above the default): it goes through.
        with pytest.raises(PromptTooLong):
            await client.generate(prompt_token_ids=[12345] * 350_000, max_tokens=1)
