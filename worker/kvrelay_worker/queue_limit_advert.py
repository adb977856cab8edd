"""A worker tells clients its model's admission limit (written with every heartbeat).

Clients push jobs through one Lua script that reads this hash (``kvrelay.admission``), so
the limit holds whatever the client's own settings. Workers of one model should share
one ``KVRELAY_MAX_QUEUE``: the last heartbeat written wins. The hash has no expiry: with
every worker down, the queue stays bounded.
"""

from __future__ import annotations

from typing import Any

from kvrelay.admission import admission_fields
from kvrelay_worker.settings import WorkerSettings


def advertise_admission(pipe: Any, settings: WorkerSettings) -> None:
    """Queue the writes of the admission hash on ``pipe`` (a redis-py pipeline)."""
    key = settings.keys.admission(settings.served_model)
    pipe.hset(key, mapping=admission_fields(settings.max_queue, settings.queue_retry_after))
    if settings.max_queue <= 0:
        pipe.hdel(key, "max_queue")
