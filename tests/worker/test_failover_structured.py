"""Constrained jobs survive their worker's death: the new owner replays each delivered
answer through a fresh grammar matcher, and every final answer is valid JSON.

Ten jobs, each with its own schema, stream from worker ``a`` (sampled at temperature 1 on
the tiny random model: only the grammar keeps them valid). One SIGKILL of ``a`` mid-stream
serves all ten (each has tokens in its log, none has finished); worker ``b``, started
after the kill, finds the expired leases, takes every job over and finishes it. Each job's log must have contiguous
``seq``, two attempts, and tokens that parse and validate against the job's schema.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from helpers.celery_send import send_requests
from helpers.job_log import read_events, wait_terminal
from helpers.worker_process import WorkerProcess
from transformers import AutoTokenizer

from kvrelay.protocol import (
    Finished,
    GenerateRequest,
    Started,
    Tokens,
    sampling_options_from,
)

pytestmark = pytest.mark.integration

JOBS = 10
MODEL = "llama-mqa"


def schema(index: int) -> dict[str, Any]:
    """Long enough answers (a fixed-size array) that the kill finds every job running."""
    return {
        "type": "object",
        "properties": {
            "id": {"const": index},
            "values": {"type": "array", "minItems": 20, "maxItems": 20,
                       "items": {"type": "integer", "minimum": 100, "maximum": 999}},
            "tag": {"enum": ["red", "green", "blue"]},
        },
        "required": ["id", "values", "tag"],
        "additionalProperties": False,
    }


def request(index: int) -> GenerateRequest:
    fmt = {"type": "json_schema", "json_schema": {"name": f"s{index}", "schema": schema(index)}}
    options = sampling_options_from({"max_tokens": 3000, "temperature": 1.0, "seed": index,
                                     "response_format": fmt})
    return GenerateRequest(job_id=uuid.uuid4().hex, model=MODEL, prompt="Numbers:",
                           sampling=options, enqueued_at=time.time())


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise TimeoutError(what)


def _streaming(url: str, job_id: str) -> bool:
    events = read_events(url, job_id)
    return any(isinstance(e, Tokens) for e in events)


def test_ten_constrained_jobs_survive_one_kill(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        tiny_model_path: str) -> None:
    url = clean_redis_url
    a = start_worker("a", concurrency=JOBS)
    requests = [request(i) for i in range(JOBS)]
    send_requests(url, requests)
    _wait(lambda: all(_streaming(url, r.job_id) for r in requests), 60,
          "not every job started streaming on worker a")
    a.kill()
    for r in requests:
        assert not any(isinstance(e, Finished) for e in read_events(url, r.job_id)), \
            "a job finished before the kill: make the answers longer"
    start_worker("b", concurrency=JOBS)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    for index, r in enumerate(requests):
        events = wait_terminal(url, r.job_id, timeout=90)
        assert [e.seq for e in events] == list(range(len(events)))
        assert [e.attempt for e in events if isinstance(e, Started)] == [1, 2]
        assert isinstance(events[-1], Finished), events[-1]
        assert events[-1].finish_reason == "stop"
        tokens = [t for e in events if isinstance(e, Tokens) for t in e.token_ids]
        text = "".join(e.text for e in events if isinstance(e, Tokens))
        assert tokenizer.decode(tokens, skip_special_tokens=True) == text
        jsonschema.validate(json.loads(text), schema(index))
