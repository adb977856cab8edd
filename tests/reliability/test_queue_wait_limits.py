"""The limits that keep abandoned jobs from starting fit together.

An abort flag must outlive any queue wait a job can have: the SDK refuses a longer
``queue_timeout``, workers refuse a longer ``KVRELAY_MAX_QUEUE_WAIT``, and a first pickup
past either limit is refused with ``queue_timeout`` while a taken-over job is not.
"""

from __future__ import annotations

import time

import pytest

import kvrelay
from kvrelay.client import ABORT_FLAG_TTL_S
from kvrelay.protocol import ErrorCode, GenerateRequest
from kvrelay.queue_push import MAX_QUEUE_TIMEOUT_S
from kvrelay.request_builder import build_request
from kvrelay_worker.intake.job_request import JobRejected
from kvrelay_worker.intake.pickup_checks import check_queue_wait
from kvrelay_worker.settings import SettingsError, WorkerSettings


def test_abort_flags_outlive_every_queue_wait() -> None:
    assert MAX_QUEUE_TIMEOUT_S < ABORT_FLAG_TTL_S
    assert WorkerSettings().max_queue_wait <= MAX_QUEUE_TIMEOUT_S
    with pytest.raises(SettingsError, match="MAX_QUEUE_WAIT"):
        WorkerSettings(max_queue_wait=MAX_QUEUE_TIMEOUT_S + 1)
    for bad in (0, -1, float("nan"), float("inf"), MAX_QUEUE_TIMEOUT_S + 1, "5"):
        with pytest.raises(kvrelay.InvalidRequest, match="queue_timeout"):
            build_request("hi", {"queue_timeout": bad}, default_model="m")
        with pytest.raises(kvrelay.InvalidRequest, match="queue_timeout"):
            kvrelay.AsyncClient(model="m", queue_timeout=bad)  # type: ignore[arg-type]
    _, settings = build_request("hi", {"queue_timeout": 12.5}, default_model="m")
    assert settings.queue_timeout == 12.5


def _request(enqueued_at: float, queue_deadline: float | None) -> GenerateRequest:
    return GenerateRequest(job_id="j", model="m", prompt="hi", enqueued_at=enqueued_at,
                           queue_deadline=queue_deadline)


def test_first_pickups_past_their_give_up_time_are_refused() -> None:
    now = time.time()
    check_queue_wait(_request(now - 5, now + 1), 1, now, 600)  # in time
    with pytest.raises(JobRejected) as caught:
        check_queue_wait(_request(now - 5, now - 1), 1, now, 600)  # its caller gave up
    assert caught.value.code == ErrorCode.QUEUE_TIMEOUT
    with pytest.raises(JobRejected):  # no deadline of its own: the worker's bound applies
        check_queue_wait(_request(now - 700, None), 1, now, 600)
    check_queue_wait(_request(now - 5, now - 1), 2, now, 600)  # a takeover: caller waits
    check_queue_wait(_request(0.0, None), 1, now, 600)  # nothing to judge by
