"""The worker's entry in the registry clients read: written every ``lease_refresh``,
removed on shutdown, expiring by itself when the worker dies. The model's queue limit
(``queue_limit_advert``) rides along."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from kvrelay.protocol import WorkerInfo, encode_worker_info
from kvrelay_worker.periodic import Periodic
from kvrelay_worker.queue_limit_advert import advertise_queue_limit
from kvrelay_worker.redis_health import RedisHealth
from kvrelay_worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, client: redis.Redis, settings: WorkerSettings,
                 info: Callable[[], WorkerInfo], health: RedisHealth | None = None) -> None:
        self.redis = client
        self.settings = settings
        self.worker_id = settings.worker_id
        self.keys = settings.keys
        self.info = info
        self.ttl_ms = int(max(3.0, 3 * settings.lease_refresh) * 1000)
        self._thread = Periodic("kvrelay-heartbeat", settings.lease_refresh, self.beat, health)

    def start(self) -> None:
        try:
            self.beat()
        except redis.RedisError as exc:  # out of reach or failing over: the next tick
            log.warning("first heartbeat not written (%s); retrying every %.1fs", exc,
                        self.settings.lease_refresh)
            if self._thread.health is not None:
                self._thread.health.failed()
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.delete(self.keys.worker_heartbeat(self.worker_id))
            pipe.srem(self.keys.workers, self.worker_id)
            pipe.execute()
        except Exception:
            log.warning("could not remove the worker's heartbeat on shutdown")

    def beat(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.worker_heartbeat(self.worker_id), encode_worker_info(self.info()),
                 px=self.ttl_ms)
        pipe.sadd(self.keys.workers, self.worker_id)
        # This worker consumes a queue of its own (placement): mark it alive for the
        # watchdogs that empty dead workers' queues (``orphan_queues``).
        pipe.zadd(self.keys.worker_queues(self.settings.served_model),
                  {self.worker_id: int(time.time() * 1000)})
        advertise_queue_limit(pipe, self.settings)
        pipe.execute()
