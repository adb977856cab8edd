"""Dropping the unacknowledged records of messages whose job has ended, whoever holds them.

A worker acknowledges its message as its job ends and drops the records itself
(``dead_deliveries.drop_delivery_records``); a dead worker's are settled by
``dead_deliveries``. What is left: a consumer whose connection broke (its pub/sub killed,
say) restores every message it held to the queue, and when a failover loses that restore
the new primary still has the records, which no live consumer will ever acknowledge; kombu
would restore them after its visibility timeout (6 h), prompt and all, and once the job's
done record had expired the copy would run as a new job. Once per watch, each record is
looked at (at most every ``_LOOK_AGAIN_S``); the record of a job whose state is ``done``
(or whose end mark is left once its record expired) goes, in a script that reads them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Final

import redis

from kvrelay.keys import Keyspace
from kvrelay.queue_scripts import DROP_ENDED_DELIVERY
from kvrelay.redis_functions import Functions
from kvrelay_worker.jobs.store_calls import text

# How long a record found with a job still running is left before it is read again.
_LOOK_AGAIN_S: Final = 10.0


class EndedDeliveries:
    """Finds unacknowledged records of ended jobs and drops them."""

    def __init__(self, client: redis.Redis, keys: Keyspace, scripts: Functions,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redis = client
        self.keys = keys
        self.scripts = scripts
        self.clock = clock
        self._next_look: dict[str, float] = {}

    def sweep(self) -> int:
        """Drop the records of messages whose job ended; how many went."""
        now = self.clock()
        tags = [text(tag) for tag in self.redis.hkeys(self.keys.celery_unacked)]
        held = set(tags)
        self._next_look = {tag: at for tag, at in self._next_look.items() if tag in held}
        due = [tag for tag in tags if self._next_look.get(tag, 0.0) <= now]
        if not due:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for tag in due:
            pipe.hget(self.keys.celery_unacked, tag)
        jobs = {tag: job_id for tag, raw in zip(due, pipe.execute(), strict=True)
                if (job_id := _job_id(raw)) is not None}
        pipe = self.redis.pipeline(transaction=False)
        for job_id in jobs.values():
            pipe.hget(self.keys.job_record(job_id), "state")
            pipe.exists(self.keys.end_mark(job_id))
        replies = pipe.execute()
        dropped = 0
        for (tag, job_id), state, marked in zip(jobs.items(), replies[::2], replies[1::2],
                                                strict=True):
            self._next_look[tag] = now + _LOOK_AGAIN_S
            if state == b"done" or marked:
                dropped += int(self.scripts.call(
                    DROP_ENDED_DELIVERY,
                    [self.keys.celery_unacked, self.keys.celery_unacked_index,
                     self.keys.celery_delivered, self.keys.job_record(job_id)], [tag]))
        return dropped

    def drop_jobs(self, job_ids: set[str]) -> int:
        """Drop every unacknowledged record of these jobs, which this worker ended: after
        a restart that lost writes, records dropped before it are back, and once the
        jobs' ended records have expired nothing else could tell they ended."""
        if not job_ids:
            return 0
        tags = [text(tag) for tag, raw in self.redis.hgetall(self.keys.celery_unacked).items()
                if _job_id(raw) in job_ids]
        if tags:
            pipe = self.redis.pipeline(transaction=True)
            pipe.hdel(self.keys.celery_unacked, *tags)
            pipe.zrem(self.keys.celery_unacked_index, *tags)
            pipe.hdel(self.keys.celery_delivered, *tags)
            pipe.execute()
        return len(tags)


def _job_id(raw: Any) -> str | None:
    """The job id in an unacknowledged record (kombu's ``[message, exchange, routing
    key]``); None when there is none or it cannot be read."""
    if raw is None:
        return None
    try:
        job_id = json.loads(raw)[0]["headers"]["id"]
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    return str(job_id) if job_id else None
