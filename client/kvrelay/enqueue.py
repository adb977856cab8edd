"""Putting a job on the model's Celery queue, with Celery's own producer, off the loop.

Each push is admitted under the queue's limit in the same Redis call (``kvrelay.queue_push``):
a full queue raises ``QueueFull`` with a retry hint and nothing is enqueued.

Celery's publish is blocking network I/O (a round trip per job, plus a one-off app and
connection set-up), so it runs in a small pool of dedicated threads: the event loop
never waits on it, and 1,000 enqueues proceed several at a time (the producer pool
hands each thread its own connection). Celery is imported on first use so that
``import kvrelay`` stays light.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis.exceptions

from kvrelay.connection import connection_error
from kvrelay.errors import BrokerUnavailable, QueueFull
from kvrelay.keys import Keyspace
from kvrelay.prefix_placement import PrefixPlacement
from kvrelay.protocol import TASK_NAME, GenerateRequest, request_to_payload
from kvrelay.queue_push import AdmissionRefused, publish_task
from kvrelay.sentinel_url import is_sentinel_url, kombu_sentinel_settings, parse_sentinel_url
from kvrelay.tenant_quota import TenantQuota, current_quota
from kvrelay.tls import celery_ssl_options

__all__ = [
    "CeleryEnqueuer",
    "Enqueuer",
    "celery_broker_settings",
    "celery_broker_url",
]

log = logging.getLogger("kvrelay.enqueue")

# Anything that puts a request on its model's queue. ``CeleryEnqueuer`` in production;
# tests inject a coroutine function that plays the worker instead.
Enqueuer = Callable[[GenerateRequest], Awaitable[None]]


def celery_broker_url(url: str) -> str:
    """The kombu spelling of a redis-py URL (kombu names unix sockets ``redis+socket``)."""
    if url.startswith("unix://"):
        return "redis+socket://" + url[len("unix://") :]
    return url


def celery_broker_settings(url: str) -> tuple[str, dict[str, Any]]:
    """kombu's broker URL for ``url`` and the transport options it needs beside it: none
    for ``redis://``; for ``redis+sentinel://`` kombu's Sentinel transport, its primary's
    name and the replica WAIT that follows each job message (``kvrelay.queue_push``)."""
    if is_sentinel_url(url):
        return kombu_sentinel_settings(parse_sentinel_url(url))
    return celery_broker_url(url), {}


def _is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, (OSError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return True
    try:
        from kombu.exceptions import OperationalError
    except ImportError:  # pragma: no cover - kombu comes with celery
        return False
    return isinstance(exc, OperationalError)


def _pool_limit(wanted: int) -> int:
    """Celery sets kombu's connection-pool limit for the whole process (``kombu.pools``)
    and resizes every pool to it, refusing to shrink one in use: a client with fewer
    enqueue threads made after another had published failed its enqueues with "Can't
    shrink pool when in use". The limit only grows."""
    from kombu import pools

    current = pools.get_limit()
    return max(wanted, current) if isinstance(current, int) else wanted


class CeleryEnqueuer:
    """Publishes ``kvrelay.generate`` tasks (JSON only) on ``Keyspace.queue(model)``."""

    def __init__(
        self,
        broker_url: str,
        *,
        threads: int = 4,
        connect_timeout: float = 5.0,
        where: str | None = None,
        max_queue: int | None = None,
        keyspace: Keyspace | None = None,
        placement: PrefixPlacement | None = None,
    ) -> None:
        self._keys = keyspace or Keyspace()
        self._broker_url, self._broker_options = celery_broker_settings(broker_url)
        # Behind sentinels a publish that meets a dying primary retries past the failover
        # (a copy sent twice is dropped at pickup: the job is owned or done).
        self._publish_retries = 40 if is_sentinel_url(broker_url) else 2
        # Prefix-aware placement (None: every job goes to the shared queue).
        self._placement = placement
        self._broker_ssl = celery_ssl_options(broker_url)
        self._threads = max(1, threads)
        self._connect_timeout = connect_timeout
        self._where = where or broker_url
        self._max_queue = max_queue
        self._executor = ThreadPoolExecutor(
            max_workers=self._threads, thread_name_prefix="kvrelay-enqueue"
        )
        self._lock = threading.Lock()
        self._app: Any = None
        self._closed = False

    def _celery(self) -> Any:
        """The producer-only Celery app, created once, in a worker thread."""
        with self._lock:
            if self._app is None:
                from celery import Celery

                app = Celery("kvrelay-client", set_as_current=False)
                app.conf.update(
                    broker_url=self._broker_url,
                    broker_use_ssl=self._broker_ssl,
                    result_backend=None,
                    task_ignore_result=True,
                    task_serializer="json",
                    accept_content=["json"],
                    result_accept_content=["json"],
                    broker_connection_retry_on_startup=True,
                    broker_connection_timeout=self._connect_timeout,
                    broker_pool_limit=_pool_limit(self._threads + 1),
                    broker_transport_options={
                        **self._keys.celery_transport_options(),
                        **self._broker_options,
                        "socket_connect_timeout": self._connect_timeout,
                        "socket_timeout": max(self._connect_timeout, 10.0),
                    },
                    task_publish_retry=True,
                    task_publish_retry_policy={
                        "max_retries": self._publish_retries,
                        "interval_start": 0.1,
                        "interval_step": 0.2,
                        "interval_max": 0.5,
                    },
                )
                self._app = app
            return self._app

    def publish(self, request: GenerateRequest, queue: str | None = None,
                quota: tuple[TenantQuota, float] | None = None) -> None:
        """Blocking publish, admitted under the queue's limit; runs in the enqueue threads.
        ``queue``: a worker's own queue (placement); None: the model's shared queue.
        ``quota``: the tenant's quota and until when (unix s) this job counts in it."""
        publish_task(
            self._celery(),
            TASK_NAME,
            request_to_payload(request),
            task_id=request.job_id,
            keys=self._keys,
            model=request.model,
            max_queue=self._max_queue,
            queue=queue,
            quota=quota[0] if quota is not None else None,
            counted_until=quota[1] if quota is not None else 0.0,
        )

    async def _placed_queue(self, request: GenerateRequest) -> str | None:
        """The worker queue placement picks; None (the shared queue) when it cannot tell."""
        if self._placement is None:
            return None
        try:
            return await self._placement.queue_for(request)
        except Exception as exc:  # advisory: a failed read never fails the job
            log.debug("placement unavailable (%s); using the shared queue", exc)
            return None

    def warm_up(self) -> None:
        """Build the app and open one broker connection ahead of the first job."""
        app = self._celery()
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=self._connect_timeout)

    async def __call__(self, request: GenerateRequest) -> None:
        if self._closed:
            raise BrokerUnavailable("the enqueuer is closed")
        queue = await self._placed_queue(request)
        quota = current_quota.get()  # read here: the executor's threads do not see it
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self.publish, request, queue, quota)
        except AdmissionRefused as refused:
            raise QueueFull(
                f"{refused.reason}; retry in {refused.retry_after:g}s",
                job_id=request.job_id,
                retry_after=refused.retry_after,
            ) from None
        except Exception as exc:
            if _is_connection_error(exc):
                raise connection_error(self._where, f"enqueueing job {request.job_id}",
                                       exc) from exc
            raise

    async def start_warm_up(self) -> None:
        """Warm up in the background; failures show up on the first real enqueue."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self.warm_up)
        except Exception:  # best effort by design
            pass

    async def aclose(self) -> None:
        """Release the broker connections and the threads (waiting off the loop)."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()

        def shutdown() -> None:
            self._executor.shutdown(wait=True)
            with self._lock:
                if self._app is not None:
                    self._app.close()
                    self._app = None

        await loop.run_in_executor(None, shutdown)
