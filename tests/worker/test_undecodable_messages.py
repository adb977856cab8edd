"""A message whose content type the worker refuses (pickle) still ends its job.

Celery's consumer drops such a message before any task runs; before, with a log line only,
and the caller waited for its stream timeout. Real Celery worker process, real Redis.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import httpx
import pytest
from celery import Celery
from helpers.job_log import wait_terminal
from helpers.redis_server import free_port
from helpers.worker_process import WorkerProcess
from kombu import Connection

from kvrelay.keys import Keyspace
from kvrelay.protocol import TASK_NAME, Failed

KEYS = Keyspace()  # the default namespace

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"


def _rejected(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=10).text
    match = re.search(r'kvrelay_jobs_total\{outcome="rejected"\} ([0-9.e+-]+)', text)
    return float(match.group(1)) if match else 0.0


def test_pickled_message_fails_its_job_and_one_without_id_is_counted(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    port = free_port()
    worker = start_worker("picky", concurrency=2, metrics_port=port)
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    before = _rejected(metrics_url)

    job_id = uuid.uuid4().hex
    app = Celery(broker=clean_redis_url)
    app.conf.update(task_serializer="pickle", accept_content=["pickle", "json"])
    try:
        app.send_task(TASK_NAME, args=[{"job_id": job_id, "model": MODEL}], task_id=job_id,
                      queue=KEYS.queue(MODEL), serializer="pickle")
    finally:
        app.close()
    (event,) = wait_terminal(clean_redis_url, job_id, timeout=30)
    assert isinstance(event, Failed)
    assert event.code == "invalid_request"
    assert "application/x-python-serialize" in event.message

    # No headers at all: nothing to fail, but the message is still counted.
    with Connection(clean_redis_url) as connection:
        connection.default_channel.basic_publish(
            connection.default_channel.prepare_message(
                b"\x80\x04N.", content_type="application/x-python-serialize",
                content_encoding="binary"),
            exchange=KEYS.queue(MODEL), routing_key=KEYS.queue(MODEL))
    deadline_checks = 100
    while _rejected(metrics_url) < before + 2 and deadline_checks:
        deadline_checks -= 1
        worker.wait_for_stats(lambda s: True, timeout=5)
    assert _rejected(metrics_url) == before + 2
    assert worker.alive()
