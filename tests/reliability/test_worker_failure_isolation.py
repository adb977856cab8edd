"""Through a real worker: a job that would break the engine fails alone, the others finish.

Before failure isolation, a job with ``top_k = 2**63`` (accepted by the worker's checks)
made the engine step raise and the worker failed every job it held as ``internal``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from helpers.celery_send import greedy_request, send_raw, send_requests
from helpers.job_log import read_events, wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay.protocol import Failed, Finished, Tokens

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
MAX_TOKENS = 48


def tokens_of(events: list[object]) -> list[int]:
    return [t for e in events if isinstance(e, Tokens) for t in e.token_ids]


def test_a_hostile_job_fails_alone(start_worker: Callable[..., WorkerProcess],
                                   clean_redis_url: str) -> None:
    worker = start_worker("isolation", concurrency=8)
    prompts = [[20 + i, 300, 4000 + i, 77] for i in range(4)]
    alone = greedy_request(MODEL, prompts[0], MAX_TOKENS)
    send_requests(clean_redis_url, [alone])
    expected = tokens_of(wait_terminal(clean_redis_url, alone.job_id, timeout=300))
    assert len(expected) == MAX_TOKENS

    longs = [greedy_request(MODEL, p, MAX_TOKENS) for p in prompts]
    send_requests(clean_redis_url, longs)
    deadline = time.monotonic() + 60
    while not all(tokens_of(read_events(clean_redis_url, j.job_id)) for j in longs):
        assert time.monotonic() < deadline, "the long jobs never started"
        time.sleep(0.02)
    hostile_id = uuid.uuid4().hex
    payload = {"job_id": hostile_id, "model": MODEL, "prompt_token_ids": [1, 2, 3],
               "sampling": {"max_tokens": 50, "temperature": 1.0, "top_k": 2**63}}
    send_raw(clean_redis_url, MODEL, [(hostile_id, [payload], {})])

    hostile_events = wait_terminal(clean_redis_url, hostile_id, timeout=300)
    assert isinstance(hostile_events[-1], Failed)
    assert hostile_events[-1].message
    for job in longs:
        events = wait_terminal(clean_redis_url, job.job_id, timeout=300)
        assert isinstance(events[-1], Finished), events[-1]
        assert len(tokens_of(events)) == MAX_TOKENS
    assert tokens_of(read_events(clean_redis_url, longs[0].job_id)) == expected
    assert worker.alive()
    worker.wait_for_stats(lambda s: s["free_blocks"] == s["total_blocks"])
