"""Payloads that blow up while being decoded still get their ``Failed`` event.

A lone surrogate cannot be encoded as UTF-8 and deep nesting exhausts the recursion limit;
before, both killed the task (Celery acked it) and the caller waited for its stream timeout.
Real Celery worker process, real Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from helpers.bad_payloads import LONE_SURROGATE, nested_stop_json
from helpers.celery_send import send_raw
from helpers.job_log import wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay.protocol import Failed

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"


def surrogate_prompt(job_id: str) -> dict[str, Any]:
    return {"job_id": job_id, "model": MODEL, "prompt": f"hi {LONE_SURROGATE}",
            "sampling": {"max_tokens": 4}}


CASES: dict[str, Callable[[str], object]] = {
    "lone surrogate in the prompt": surrogate_prompt,
    "lone surrogate as the whole payload": lambda j: LONE_SURROGATE,
    "900 levels of nesting": lambda j: nested_stop_json(j, MODEL, 900),
    "5000 levels of nesting": lambda j: nested_stop_json(j, MODEL, 5000),
}


def test_undecodable_payloads_fail_as_invalid_request(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    worker = start_worker("undecodable", concurrency=2)
    jobs = {uuid.uuid4().hex: name for name in CASES}
    send_raw(clean_redis_url, MODEL,
             [(job_id, [CASES[name](job_id)], {}) for job_id, name in jobs.items()])
    for job_id, name in jobs.items():
        events = wait_terminal(clean_redis_url, job_id, timeout=30)
        assert len(events) == 1, (name, events)
        assert isinstance(events[0], Failed), (name, events)
        assert events[0].code == "invalid_request", (name, events[0])
    assert worker.alive()
