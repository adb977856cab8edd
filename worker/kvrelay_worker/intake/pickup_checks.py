"""Checks a job must pass when a worker picks it up for the first time.

A job whose caller stopped waiting must never start, however long it sat in the queue:
its ``queue_deadline`` (sent by the SDK) says when the caller gives up on a pickup, and
``max_queue_wait`` bounds payloads that carry none (counted from ``enqueued_at``). Both
stay shorter than an abort flag's life, so a caller that left, whether it could say so
or not, leaves no job that runs later. A job taken over after a failover is exempt: its
caller is still listening (or has set the abort flag, which the claim checks); so is one
whose message a worker took in time and died holding, unclaimed (``dead_deliveries``): it
never started, and an SDK caller that gave up meanwhile has set the abort flag.
"""

from __future__ import annotations

from collections.abc import Callable

from kvrelay.protocol import ErrorCode, GenerateRequest
from kvrelay_worker.intake.job_request import JobRejected


def give_up_time(request: GenerateRequest, max_queue_wait: float) -> float | None:
    """Unix time after which no worker may start ``request`` (None: no bound known)."""
    return give_up_at(request.queue_deadline, request.enqueued_at, max_queue_wait)


def give_up_at(queue_deadline: float | None, enqueued_at: float,
               max_queue_wait: float) -> float | None:
    """``give_up_time`` from the two fields (as a payload not decoded yet holds them)."""
    limits = []
    if queue_deadline is not None:
        limits.append(queue_deadline)
    if enqueued_at > 0:
        limits.append(enqueued_at + max_queue_wait)
    return min(limits) if limits else None


def check_queue_wait(request: GenerateRequest, attempt: int, now: float,
                     max_queue_wait: float, picked_in_time: Callable[[], bool] = bool) -> None:
    """Raise ``JobRejected(queue_timeout)`` for a first pickup after its give-up time,
    unless ``picked_in_time()``: a worker that died took it in time (asked only then)."""
    if attempt != 1:
        return
    limit = give_up_time(request, max_queue_wait)
    if limit is not None and now > limit and not picked_in_time():
        raise JobRejected(
            ErrorCode.QUEUE_TIMEOUT,
            f"no worker picked the job up before its queue deadline (passed {now - limit:.1f}s "
            f"ago); it was not started",
        )
