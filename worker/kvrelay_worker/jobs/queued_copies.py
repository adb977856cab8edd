"""Is a copy of a job waiting anywhere? Asked by the watch about a job left ``queued`` whose
copy was not claimed in time (``failover``), and about a job admitted and not claimed by
its due time (``fresh_watch``), before it pushes one more.

A copy waits in the model's shared queue (one list per priority step), in a worker's own
queue (placement), or in kombu's unacknowledged hash once a worker took it (a dead
worker's is given back by ``dead_deliveries``). kombu keeps the job id in each message's
JSON headers, so the id in quotes finds it. One look reads each list once, whatever the
number of jobs asked about. A copy missed while it moves between two places costs a
duplicate, which the claim drops.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import redis

from kvrelay.keys import Keyspace
from kvrelay_worker.jobs.orphan_queues import priority_lists
from kvrelay_worker.jobs.store_calls import text

# Messages per LRANGE page while looking through a queue.
_PAGE: Final = 500


def has_copy(client: redis.Redis, keys: Keyspace, model: str, job_id: str) -> bool:
    """True when a message of ``job_id`` waits in one of ``model``'s queues or is taken."""
    return bool(waiting_copies(client, keys, model, [job_id]))


def waiting_copies(client: redis.Redis, keys: Keyspace, model: str,
                   job_ids: Iterable[str]) -> set[str]:
    """Those of ``job_ids`` with a message waiting in ``model``'s queues or taken."""
    needles = {f'"{job_id}"'.encode(): job_id for job_id in job_ids}
    found: set[str] = set()

    def look(items: list[Any]) -> bool:
        for item in items:
            raw = bytes(item)
            for needle in [n for n in needles if n in raw]:
                found.add(needles.pop(needle))
        return not needles

    workers = [text(w) for w in client.zrange(keys.worker_queues(model), 0, -1)]
    lists = priority_lists(keys.queue(model))
    for worker in workers:
        lists += priority_lists(keys.worker_queue(model, worker))
    for name in lists:
        start = 0
        while needles:
            page: list[Any] = client.lrange(name, start, start + _PAGE - 1)
            if look(page) or len(page) < _PAGE:
                break
            start += _PAGE
        if not needles:
            return found
    look(client.hvals(keys.celery_unacked))
    return found
