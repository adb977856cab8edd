"""A copy of a job's message that turns up after the job's record expired is dropped.

Real Redis, a real worker process (simulated engine), ``KVRELAY_LOG_TTL`` of 1 s. Jobs
run and end; their records and logs expire; then a copy of each message reaches the
queue again, as kombu's restore at a reconnect or a worker that stalled holding a
prefetched copy would bring it (chaos seed 10055). The worker drops every copy (its end
mark says the job ended): no log comes back, no ``Started``, no second ending. Before,
with the record gone, each copy was claimed as attempt 1 and its job ran a second time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
from helpers.celery_send import greedy_request, send_requests
from helpers.injected_faults import FAST
from helpers.job_log import read_events, wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay.keys import Keyspace
from kvrelay.protocol import Finished, Started

pytestmark = pytest.mark.integration

KEYS = Keyspace()
MODEL = "simulated"
JOBS = 6


@pytest.mark.timeout(120)
def test_copies_of_ended_jobs_after_their_records_expired_never_run(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    url = clean_redis_url
    worker = start_worker("w", model=MODEL, **(FAST | {"log_ttl": 1.0}))
    admin = redis.Redis.from_url(url)
    requests = [greedy_request(MODEL, [1, 2, 3, i], 8) for i in range(JOBS)]
    send_requests(url, requests)
    for request in requests:
        events = wait_terminal(url, request.job_id, 30)
        assert isinstance(events[-1], Finished)
    deadline = time.monotonic() + 15
    while any(admin.exists(KEYS.job_record(r.job_id), KEYS.event_log(r.job_id))
              for r in requests):
        assert time.monotonic() < deadline, "records and logs did not expire"
        time.sleep(0.1)

    send_requests(url, requests)  # the late copies, same ids, same requests
    deadline = time.monotonic() + 20
    while worker.tail(None).count("(done)") < JOBS:
        ran = [r.job_id for r in requests if admin.exists(KEYS.event_log(r.job_id))]
        assert not ran, f"late copies ran again: {ran}"
        assert time.monotonic() < deadline, worker.tail(4000)
        time.sleep(0.1)
    time.sleep(1.0)  # a copy run by mistake would have written by now
    for request in requests:
        assert not admin.exists(KEYS.event_log(request.job_id)), read_events(url, request.job_id)
        assert not any(isinstance(e, Started) for e in read_events(url, request.job_id))
        assert admin.exists(KEYS.end_mark(request.job_id))
    admin.close()
