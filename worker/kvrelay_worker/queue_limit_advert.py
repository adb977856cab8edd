"""A worker tells clients its model's queue limit (written with every heartbeat).

Clients push jobs through one Lua script that reads this hash (``kvrelay.queue_push``), so
the limit holds whatever the client's own settings. Workers of one model should share
one ``KVRELAY_MAX_QUEUE``: the last heartbeat written wins. The hash has no expiry: with
every worker down, the queue stays bounded.
"""

from __future__ import annotations

from typing import Any

from kvrelay.queue_push import queue_limit_fields
from kvrelay_worker.settings import WorkerSettings


def advertise_queue_limit(pipe: Any, settings: WorkerSettings) -> None:
    """Queue the writes of the queue-limit hash on ``pipe`` (a redis-py pipeline)."""
    key = settings.keys.queue_limit(settings.served_model)
    pipe.hset(key, mapping=queue_limit_fields(settings.max_queue, settings.queue_retry_after,
                                              claim_due_ms=round(settings.lease_ttl * 1000)))
    if settings.max_queue <= 0:
        pipe.hdel(key, "max_queue")
