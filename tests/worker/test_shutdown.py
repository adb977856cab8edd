"""SIGTERM: running jobs finish (or, past the grace period, move to another worker), queued
jobs stay on the queue for the others; nothing is lost."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest
from helpers.celery_send import greedy_request, send_requests
from helpers.job_log import read_events, wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay.protocol import Finished, Started, Tokens

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"


def _enqueue(url: str, count: int, max_tokens: int) -> list[str]:
    requests = [greedy_request(MODEL, [40 + i, 41, 42], max_tokens) for i in range(count)]
    send_requests(url, requests)
    return [r.job_id for r in requests]


def _started_by(url: str, job_id: str) -> list[str]:
    return [e.worker for e in read_events(url, job_id) if isinstance(e, Started)]


def _wait_started(url: str, job_ids: list[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(any(isinstance(e, Tokens) for e in read_events(url, j)) for j in job_ids):
            return
        time.sleep(0.05)
    raise TimeoutError("jobs did not start")


def test_sigterm_finishes_running_jobs_and_leaves_queued_ones(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    # A grace far longer than the running jobs take even on a slow, busy machine (with 60 s
    # and 800 tokens each, a loaded CI runner handed them back once).
    a = start_worker("a", concurrency=2, shutdown_grace=180)
    running = _enqueue(clean_redis_url, 2, max_tokens=400)
    _wait_started(clean_redis_url, running)
    queued = _enqueue(clean_redis_url, 2, max_tokens=50)
    a.signal(signal.SIGTERM)
    b = start_worker("b", concurrency=2)
    assert a.wait_exit(200) == 0
    for job_id in running + queued:
        events = wait_terminal(clean_redis_url, job_id, timeout=90)
        assert isinstance(events[-1], Finished), events[-1]
        assert [e.seq for e in events] == list(range(len(events)))
    for job_id in running:
        workers = _started_by(clean_redis_url, job_id)
        assert len(workers) == 1
        assert workers[0].endswith(f":{a.pid}")
    for job_id in queued:
        workers = _started_by(clean_redis_url, job_id)
        assert len(workers) == 1
        assert workers[0].endswith(f":{b.pid}")


def test_sigterm_hands_back_jobs_that_outlast_the_grace_period(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    a = start_worker("a", concurrency=2, shutdown_grace=1)
    # 600 tokens run for many seconds, far past the 1 s grace.
    (job_id,) = _enqueue(clean_redis_url, 1, max_tokens=600)
    _wait_started(clean_redis_url, [job_id])
    a.signal(signal.SIGTERM)
    assert a.wait_exit(60) == 0
    b = start_worker("b", concurrency=2)
    events = wait_terminal(clean_redis_url, job_id, timeout=120)
    assert isinstance(events[-1], Finished)
    assert [e.seq for e in events] == list(range(len(events)))
    starts = [e for e in events if isinstance(e, Started)]
    assert [s.worker.endswith(f":{w.pid}") for s, w in zip(starts, (a, b))] == [True, True]
    tokens = [t for e in events if isinstance(e, Tokens) for t in e.token_ids]
    assert len(tokens) == 600
