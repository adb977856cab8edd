"""Is a copy of a job waiting anywhere? Asked by the watch (``failover``) about a job left
``queued`` whose copy was not claimed in time, before it pushes one more.

A copy waits in the model's shared queue (one list per priority step), or in kombu's
unacknowledged hash once a worker took it (a dead worker's is given back by
``dead_deliveries``). kombu keeps the job id in each message's JSON headers, so the id
in quotes finds it. A copy missed while it moves between the two costs a duplicate,
which the claim drops.
"""

from __future__ import annotations

from typing import Any, Final

import redis

from kvrelay.keys import Keyspace
from kvrelay_worker.jobs.orphan_queues import priority_lists

# Messages per LRANGE page while looking through a queue.
_PAGE: Final = 500


def has_copy(client: redis.Redis, keys: Keyspace, model: str, job_id: str) -> bool:
    """True when a message of ``job_id`` waits in ``model``'s shared queue or is taken."""
    needle = f'"{job_id}"'.encode()
    for name in priority_lists(keys.queue(model)):
        start = 0
        while True:
            page: list[Any] = client.lrange(name, start, start + _PAGE - 1)
            if any(needle in bytes(item) for item in page):
                return True
            if len(page) < _PAGE:
                break
            start += _PAGE
    taken: list[Any] = client.hvals(keys.celery_unacked)
    return any(needle in bytes(item) for item in taken)
