"""Moving the jobs waiting in a dead worker's own queue onto the model's shared queue.

Prefix-aware placement puts a job on one worker's queue (``Keyspace.worker_queue``); only that worker
consumes it. When the worker dies, its waiting jobs would wait forever, so the live
workers' watchdog looks, once per ``watchdog_interval``, at the workers whose heartbeat
stopped refreshing their entry in ``Keyspace.worker_queues(model)`` and moves each dead
worker's lists onto the shared queue in one script (the heartbeat is checked inside it,
so a worker that is merely late keeps its jobs, and two live workers never both move
the same job).

kombu keeps a queue as one Redis list per priority step (``<name>\\x06\\x16<step>``, the
plain name for 0): each moves to the same step of the shared queue, at the front (the
end consumers pop), oldest job next, since these jobs have waited longest. A job the dead
worker had taken but not acknowledged sits in kombu's unacked hash and is either taken
over through its lease (failover) or, without one, given back by the live workers'
watch (``dead_deliveries``); the entry is kept until kombu's visibility timeout, so that
a late copy kombu restores to the dead worker's list is moved too.
"""

from __future__ import annotations

import logging
import time

import redis
from kombu.transport.redis import Channel

from kvrelay.lua_library import LIBRARY
from kvrelay.queue_scripts import MOVE_ORPHANS
from kvrelay.redis_functions import Functions
from kvrelay_worker.settings import WorkerSettings

log = logging.getLogger(__name__)




def priority_lists(queue: str) -> list[str]:
    """kombu's lists of one queue, one per priority step."""
    return [queue if step == 0 else f"{queue}{Channel.sep}{step}"
            for step in Channel.priority_steps]


class OrphanQueues:
    """Finds dead workers' own queues and empties them onto the shared queue."""

    def __init__(self, client: redis.Redis, settings: WorkerSettings,
                 heartbeat_ttl_s: float, scripts: Functions | None = None) -> None:
        self.redis = client
        self.keys = settings.keys
        self.model = settings.served_model
        self.heartbeat_ttl_ms = int(heartbeat_ttl_s * 1000)
        # kombu restores an unacknowledged message after the visibility timeout, on one
        # of its restore sweeps: the registry keeps a dead worker's entry past that.
        self.keep_ms = int((settings.visibility_timeout + settings.unacked_restore_interval
                            * settings.unacked_restore_throttle + 60.0) * 1000)
        # The worker's script caller (one that loads what Redis lost), or one of its own.
        self.scripts = scripts or Functions(client, LIBRARY, namespace=self.keys.namespace)

    def sweep(self) -> int:
        """Move the queues of every worker that looks dead; the number of jobs moved."""
        now_ms = int(time.time() * 1000)
        registry = self.keys.worker_queues(self.model)
        stale = self.redis.zrangebyscore(registry, "-inf", now_ms - self.heartbeat_ttl_ms)
        moved = 0
        for raw in stale:
            worker_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            moved += self.move(worker_id, forget_before_ms=now_ms - self.keep_ms)
        return moved

    def move(self, worker_id: str, *, forget_before_ms: int = 0) -> int:
        """Move ``worker_id``'s waiting jobs to the shared queue unless it is alive."""
        pairs: list[str] = []
        sources = priority_lists(self.keys.worker_queue(self.model, worker_id))
        for source, destination in zip(sources, priority_lists(self.keys.queue(self.model)),
                                       strict=True):
            pairs += [source, destination]
        result = int(self.scripts.call(
            MOVE_ORPHANS,
            [self.keys.worker_queues(self.model), self.keys.worker_heartbeat(worker_id), *pairs],
            [worker_id, forget_before_ms]))
        if result > 0:
            log.warning("worker %s is gone; moved the %d jobs waiting in its own queue to "
                        "the shared queue", worker_id, result)
        return max(result, 0)
