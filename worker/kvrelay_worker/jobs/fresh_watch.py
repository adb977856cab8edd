"""Pushing again the message of a job admitted and never claimed, when it waits nowhere.

kombu's consumer takes a message with ``BRPOP`` (Redis removes it from the queue) and
records it as unacknowledged only once the reply has reached the worker; a reply lost on
the way (its connection cut or blackholed, the worker killed with the reply in its
socket, or a message a worker held only in memory) leaves the message nowhere a watch
could find it. Admission keeps each job's message in its record and an entry in the
model's fresh set (``Keyspace.fresh_jobs``), due one lease period after the push; the
claim removes both. Once per watch (``failover``), a live worker looks at the due
entries: a job still unclaimed whose message is in no queue and not taken gets it back at
the front of the shared queue (counted as never started: picked in time when its queue
deadline had not passed). A job that simply waits its turn is looked at again later, the
wait doubling up to ``_LONGEST_WAIT_MS``, so a long backlog costs one read of the queues
per watch at most. A copy pushed while the original reaches a live worker is a duplicate
that the claim drops.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Final

from kvrelay_worker.jobs.dead_deliveries import priority_step, taken_in_time
from kvrelay_worker.jobs.lease_ops import LeaseOps
from kvrelay_worker.jobs.orphan_queues import priority_lists
from kvrelay_worker.jobs.queued_copies import waiting_copies

log = logging.getLogger(__name__)

# The most jobs looked at per watch, and the longest wait between two looks at one job.
_BATCH: Final = 200
_LONGEST_WAIT_MS: Final = 60_000
# ``SETTLE_FRESH``'s answer when it pushed a copy.
PUSHED: Final = 2


class FreshWatch:
    """The watch over a model's admitted, unclaimed jobs (one per worker)."""

    def __init__(self, store: LeaseOps, model: str, max_queue_wait: float) -> None:
        self.store = store
        self.model = model
        self.max_queue_wait = max_queue_wait
        self.targets = priority_lists(store.keys.queue(model))

    def sweep(self) -> int:
        """Look at every due job; the number whose message was pushed again."""
        store = self.store
        looked: list[tuple[str, str, int]] = []
        for job_id in store.due_fresh(_BATCH):
            status, message, checks = store.check_fresh(job_id)
            if status == "due":
                looked.append((job_id, message, checks))
        if not looked:
            return 0
        waiting = waiting_copies(store.redis, store.keys, self.model,
                                 [job_id for job_id, _, _ in looked])
        pushed = 0
        for job_id, message, checks in looked:
            if job_id in waiting:
                wait_ms = min(_LONGEST_WAIT_MS, store.lease_ms * 2 ** min(checks + 1, 16))
                store.settle_fresh(job_id, "", wait_ms, False, self.targets[0])
                continue
            copy, picked, target = self._copy(message)
            if store.settle_fresh(job_id, copy, store.lease_ms, picked, target) == PUSHED:
                log.warning("job %s was never claimed and its message waits nowhere (lost "
                            "on its way to a worker); pushed it again", job_id)
                pushed += 1
        return pushed

    def _copy(self, message: str) -> tuple[str, bool, str]:
        """The message to push again (marked redelivered), whether the job was taken in
        time, and the list it goes to."""
        try:
            parsed: dict[str, Any] = json.loads(message)
            parsed.setdefault("headers", {})["redelivered"] = True
        except (ValueError, AttributeError):
            return message, False, self.targets[0]
        picked = taken_in_time(parsed, time.time(), self.max_queue_wait)
        return json.dumps(parsed), picked, self.targets[priority_step(parsed)]
