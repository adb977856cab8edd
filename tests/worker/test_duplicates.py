"""Copies of a job never run it twice, and a job longer than the visibility timeout is kept.

Celery's Redis transport redelivers an unacknowledged message once the visibility
timeout passes, even while a worker is still running it. The lease makes the copy a
no-op: it is dropped while the owner is alive, so the job runs exactly once and is not
lost either.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from helpers.celery_send import greedy_request, send_requests
from helpers.job_log import wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay.protocol import Finished, Started, Tokens

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"


def test_job_delivered_twice_runs_once(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    workers = [start_worker("a", concurrency=4), start_worker("b", concurrency=4)]
    request = greedy_request(MODEL, [31, 32, 33], 400)
    send_requests(clean_redis_url, [request], copies=2)
    events = wait_terminal(clean_redis_url, request.job_id, timeout=60)
    time.sleep(1.0)  # let the second copy be picked up and dropped
    assert sum(isinstance(e, Started) for e in events) == 1
    assert isinstance(events[-1], Finished)
    tokens = [t for e in events if isinstance(e, Tokens) for t in e.token_ids]
    assert len(tokens) == 400
    logs = "".join(w.tail(20000) for w in workers)
    assert f"dropping a copy of job {request.job_id}" in logs


def test_job_longer_than_visibility_timeout_runs_once(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    short = {"visibility_timeout": 2, "unacked_restore_interval": 1,
             "unacked_restore_throttle": 1}
    workers = [start_worker("a", concurrency=4, **short), start_worker("b", concurrency=4, **short)]
    request = greedy_request(MODEL, [31, 32, 33], 800)  # several times the 2 s timeout
    send_requests(clean_redis_url, [request])
    events = wait_terminal(clean_redis_url, request.job_id, timeout=120)
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.timings.total > 4.0, "the job must outlive the visibility timeout"
    assert sum(isinstance(e, Started) for e in events) == 1
    assert [e.seq for e in events] == list(range(len(events)))
    tokens = [t for e in events if isinstance(e, Tokens) for t in e.token_ids]
    assert len(tokens) == 800
    logs = "".join(w.tail(50000) for w in workers)
    # The broker really did redeliver it while it ran, and the copy was dropped.
    assert f"dropping a copy of job {request.job_id}" in logs
