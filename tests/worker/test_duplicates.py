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
from helpers.job_log import read_events, wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay import Client
from kvrelay.protocol import Failed, Finished, Started, Tokens

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
    """The job asks for far more tokens than it gets time for: it is cancelled once the
    broker has redelivered it and the copy was dropped, so the test lasts as long as the
    redelivery takes (~3 s), however fast the machine generates."""
    short = {"visibility_timeout": 2, "unacked_restore_interval": 1,
             "unacked_restore_throttle": 1}
    workers = [start_worker("a", concurrency=4, **short), start_worker("b", concurrency=4, **short)]
    request = greedy_request(MODEL, [31, 32, 33], 4000)
    send_requests(clean_redis_url, [request])
    dropped = f"dropping a copy of job {request.job_id}"
    deadline = time.monotonic() + 60
    while dropped not in "".join(w.tail(50000) for w in workers):
        assert time.monotonic() < deadline, "the broker never redelivered the running job"
        time.sleep(0.1)
    # Redelivered while it ran, the copy dropped: the job itself is still running (kept).
    before = read_events(clean_redis_url, request.job_id)
    assert not isinstance(before[-1], (Finished, Failed)), "the job ended before redelivery"
    time.sleep(0.5)
    after = read_events(clean_redis_url, request.job_id)
    assert len(after) > len(before), "the job stopped making progress after the copy"
    with Client(clean_redis_url, model=MODEL) as client:
        client.cancel(request.job_id)
    events = wait_terminal(clean_redis_url, request.job_id, timeout=60)
    assert isinstance(events[-1], Failed)
    assert events[-1].code == "cancelled"
    assert sum(isinstance(e, Started) for e in events) == 1
    assert [e.seq for e in events] == list(range(len(events)))
    tokens = [t for e in events if isinstance(e, Tokens) for t in e.token_ids]
    assert 0 < len(tokens) < 4000
