"""Does a job exist anywhere? Answers ``resume`` for a job id nobody knows.

A job leaves traces in this order: its Celery message in its model's queue, the same
message in kombu's unacknowledged-message hash once a worker took it, then its record and
event log once the worker claimed it (kept for ``KVRELAY_LOG_TTL`` after it ends). They are
looked at in that order, so a job moving on while we look is still seen; kombu moves a
message from the queue to the hash in two steps, so a miss is looked up once more before
the job is called unknown. Queues are read only when the job has no record or log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from redis.asyncio import Redis

from kvrelay.judged_read import PipelineRun, plain_run
from kvrelay.keys import Keyspace

if TYPE_CHECKING:
    from kvrelay.job_lifecycle import JobLifecycle

__all__ = ["ENDED", "GONE", "LIVE", "is_known", "job_exists", "presence"]

# ``presence``'s answers: the job has a log or a record of a job not ended (it is live:
# queued, taken or running), its record says it ended and its log is gone, or neither
# is there.
LIVE: Final = "live"
ENDED: Final = "ended"
GONE: Final = "gone"
# Messages per LRANGE page while looking through a queue.
_PAGE: Final = 500
# Longer than kombu's gap between taking a message off the queue and recording it.
_SECOND_LOOK_AFTER_S: Final = 0.25


async def job_exists(
    redis: Redis, keys: Keyspace, job_id: str, models: Iterable[str]
) -> bool:
    """True when ``job_id`` is queued (for one of ``models``), taken, running or still
    has its log; False when no trace of it is left (never enqueued, or expired)."""
    queues = [keys.queue(model) for model in sorted(set(models))]
    needle = f'"{job_id}"'.encode()
    for attempt in range(2):
        if attempt:
            await asyncio.sleep(_SECOND_LOOK_AFTER_S)
        if await _has_trace(redis, keys, job_id, queues, needle):
            return True
    return False


async def is_known(jobs: JobLifecycle, job_id: str, default_model: str | None) -> bool:
    """``job_exists`` over the queues of the models live workers serve and the client's
    default model."""
    models = {worker.model for worker in await jobs.workers()}
    if default_model:
        models.add(default_model)
    return await job_exists(jobs.redis, jobs.keys, job_id, models)


async def _has_trace(
    redis: Redis, keys: Keyspace, job_id: str, queues: list[str], needle: bytes
) -> bool:
    if await redis.exists(keys.job_record(job_id), keys.event_log(job_id)):
        return True
    for queue in queues:
        if await _list_holds(redis, queue, needle):
            return True
    taken = await redis.hvals(keys.celery_unacked)
    if any(needle in _as_bytes(message) for message in taken):
        return True
    return bool(await redis.exists(keys.job_record(job_id), keys.event_log(job_id)))


async def _list_holds(redis: Redis, key: str, needle: bytes) -> bool:
    start = 0
    while True:
        page = await redis.lrange(key, start, start + _PAGE - 1)
        if any(needle in _as_bytes(message) for message in page):
            return True
        if len(page) < _PAGE:
            return False
        start += _PAGE


def _as_bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


async def presence(redis: Redis, keys: Keyspace, job_id: str, *,
                   run: PipelineRun = plain_run) -> str:
    """The job's log and record read together (one transaction, executed by ``run``):
    ``LIVE``, ``ENDED`` (a done record outlived the log) or ``GONE`` (no record, no log:
    it may still wait in a queue, unrecorded, which ``job_exists`` looks for)."""
    pipe = redis.pipeline(transaction=True)
    pipe.exists(keys.event_log(job_id))
    pipe.exists(keys.job_record(job_id))
    pipe.hget(keys.job_record(job_id), "state")
    has_log, has_record, state = await run(pipe)
    if has_log:
        return LIVE
    if not has_record:
        return GONE
    return ENDED if state in (b"done", "done") else LIVE
