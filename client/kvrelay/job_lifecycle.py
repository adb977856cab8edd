"""``JobLifecycle``: the one owner of a client's jobs from the first check to abort.

A stream asks it to precheck its request (refuse before anything is sent), to enqueue it,
and to abort the job when the caller leaves early; it also keeps the set of live streams
(so closing the client aborts them) and the background aborts still in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Final, Protocol

import redis
from redis.asyncio import Redis

from kvrelay import event_log
from kvrelay.connection import REDIS_ERRORS, connection_error
from kvrelay.dispatcher import Dispatcher
from kvrelay.enqueue import Enqueuer
from kvrelay.errors import (
    InvalidRequest,
    JobIdReused,
    KvrelayError,
    PayloadTooLarge,
    QueueFull,
)
from kvrelay.job_scripts import RESERVE, UNWATCH
from kvrelay.judged_read import judged_run
from kvrelay.keys import Keyspace
from kvrelay.lua_library import LIBRARY
from kvrelay.patience import passing, patiently
from kvrelay.protocol import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    AbortMessage,
    GenerateRequest,
    WorkerInfo,
    encode_control,
    encode_request,
    request_digest,
)
from kvrelay.redis_functions import AsyncFunctions
from kvrelay.replica_wait import ReplicaWait
from kvrelay.served_models import FRESH_S as SERVED_FRESH_S
from kvrelay.served_models import ServedModels
from kvrelay.workers import (
    live_workers,
    missing_adapter,
    payload_limits,
    served_adapters,
    served_models,
)
from kvrelay.write_carrier import pool_primary

__all__ = ["ABORT_FLAG_TTL_S", "JobLifecycle"]

log = logging.getLogger("kvrelay.client")


class LiveStream(Protocol):
    """What the lifecycle needs of a stream it tracks (``kvrelay.stream.AsyncStream``):
    named here so the lifecycle does not import the stream that imports it."""

    @property
    def job_id(self) -> str: ...

    @property
    def worker(self) -> str | None: ...

    async def aclose(self) -> None: ...

# How long an abort flag lives: longer than any job may wait in a queue (the SDK caps
# ``queue_timeout`` and workers cap ``KVRELAY_MAX_QUEUE_WAIT`` below it), so an abandoned
# job is still marked aborted whenever a worker could pick it up.
ABORT_FLAG_TTL_S: Final = 3600
# How long a watcher registration (a job's watcher count, the set of watching streams)
# lives unless refreshed: a live watching stream's client refreshes it every
# ``WATCH_REFRESH_S``, so it expires this soon after the last such client dies without
# leaving (while it lives on, every worker checks each of its jobs for watchers).
WATCH_TTL_S: float = 30.0
WATCH_REFRESH_S: float = 10.0






class JobLifecycle:
    """Prechecks, enqueues and aborts the jobs of one client; tracks its live streams.

    ``redis`` (commands, log reads) and ``dispatcher`` (the shared subscriber) are the
    connections a stream reads its job's events through; ``keys`` (the client's
    namespace) names the job's channel, log and record; ``reply_channel`` is where the
    workers publish the events of every job this client starts.
    """

    def __init__(
        self,
        redis: Redis,
        dispatcher: Dispatcher,
        enqueuer: Enqueuer,
        *,
        where: str,
        require_worker: bool,
        max_queue: int | None,
        keys: Keyspace | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        stream_buffer_bytes: int | None = None,
        on_job_end: Callable[[str, str | None], None] | None = None,
        reconnect_timeout: float = 30.0,
        replica_wait: ReplicaWait | None = None,
    ) -> None:
        self.redis = redis
        # Behind sentinels: the replicas a reserve or a cancel waits for (``WAIT``, on
        # the write's own connection), so a failover cannot lose it.
        self._replica_wait = replica_wait or ReplicaWait(0, 0)
        # How long a call waits out a failover (``kvrelay.patience``) before it fails.
        self.reconnect_timeout = reconnect_timeout
        # What one stream may hold of events its reader has not taken (None: no bound).
        self.stream_buffer_bytes = stream_buffer_bytes
        # Told every job whose stream ends, with the worker that ran it (placement counts
        # this client's jobs in flight on each worker).
        self._on_job_end = on_job_end
        self.dispatcher = dispatcher
        self.keys = keys if keys is not None else Keyspace()
        self.reply_channel = self.keys.reply_channel(uuid.uuid4().hex)
        self._enqueuer = enqueuer
        self._where = where
        # Prechecks: a model some live worker serves (when required), a queue not too long.
        # (``kvrelay.served_models``: a failover does not make a model unknown).
        self._served = ServedModels(self._read_workers, patience=reconnect_timeout)
        self._require_worker = require_worker
        self._max_queue = max_queue
        # A payload larger than the default must fit the model's workers' advertised limit.
        self._max_payload_bytes = max_payload_bytes
        # Per model: the smallest payload limit its live workers advertise.
        self._payload_limits: dict[str, int] = {}
        # Per model: the LoRA adapters its live workers hold (as of the latest read).
        self._adapters: dict[str, frozenset[str]] = {}
        self._live: weakref.WeakSet[LiveStream] = weakref.WeakSet()
        self._background: set[asyncio.Task[None]] = set()
        # The watching streams of this client (token -> job id), whose registrations
        # ``_refresh_watches`` keeps alive.
        self._watched: dict[str, str] = {}
        self._refresher: asyncio.Task[None] | None = None
        # kvrelay's scripts (Redis Functions); a tenant's user may not load them, the
        # default namespace's client loads them where they are missing.
        self.scripts = AsyncFunctions(redis, LIBRARY, namespace=self.keys.namespace,
                                      may_load=not self.keys.namespace)

    # ------------------------------------------------------------------ a job's steps

    async def precheck(self, request: GenerateRequest) -> None:
        """Refuse before enqueueing: no worker for the model, or its queue too long."""
        model = request.model
        if self._require_worker:
            await self._served.require(model)
        if self._require_worker and request.lora is not None:
            missing = missing_adapter(self._adapters, model, request.lora)
            if missing is not None:  # loaded since the latest read, maybe: look again
                await self.workers()
                missing = missing_adapter(self._adapters, model, request.lora)
            if missing is not None:
                raise InvalidRequest(missing, job_id=request.job_id)
        if self._max_payload_bytes > DEFAULT_MAX_PAYLOAD_BYTES:
            await self._check_payload_limit(request)
        if self._max_queue is not None:
            length = await self.queue_length(model)
            if length > self._max_queue:
                raise QueueFull(
                    f"the queue of model {model!r} holds {length} jobs "
                    f"(max_queue={self._max_queue})"
                )

    async def _check_payload_limit(self, request: GenerateRequest) -> None:
        """A client may raise ``max_payload_bytes`` past the default only as far as the
        model's workers advertise (none advertising: the default stands)."""
        size = len(encode_request(request))
        if size <= DEFAULT_MAX_PAYLOAD_BYTES:
            return
        await self._served.get(SERVED_FRESH_S)
        limit = self._payload_limits.get(request.model, DEFAULT_MAX_PAYLOAD_BYTES)
        if size > limit:
            raise PayloadTooLarge(
                f"request is {size} bytes of JSON; the workers of model {request.model!r} "
                f"accept at most {limit}",
                job_id=request.job_id,
            )

    async def reserve(self, request: GenerateRequest) -> bool:
        """Claim ``request.job_id`` for this request: True for a new job, or one an
        earlier send of the same request reserved but never got onto a queue (enqueue
        it); False when the same request already has it (attach to that job); raises
        ``JobIdReused`` when another request has it."""
        record = self.keys.job_record(request.job_id)
        digest = request_digest(request)
        async def send() -> Any:
            pipe = self.redis.pipeline(transaction=False)
            await self.scripts.queue(pipe, RESERVE, [record],
                                     [event_log.DIGEST_FIELD, digest, event_log.LIVE_LOG_TTL_S])
            return (await self._replicated(pipe))[0]

        try:
            created, held = await patiently(lambda: self.scripts.retry_missing(send),
                                            self.reconnect_timeout)
        except REDIS_ERRORS as exc:
            raise self.connection_error(exc, f"reserving job id {request.job_id}") from exc
        if created:
            return True
        if held is not None and held.decode() != digest:
            raise JobIdReused(
                f"job id {request.job_id!r} already belongs to a job with a different "
                "request; use a new job_id (a retry must send the same request)",
                job_id=request.job_id,
            )
        return False

    async def enqueue(self, request: GenerateRequest) -> None:
        """Put the reserved job on its queue; a failed send gives the reservation back
        (best effort), so the same request may be retried as a new job."""
        try:
            # A copy sent twice (the first publish got through, its reply did not) is
            # dropped by the worker that picks it up: the job is owned or done.
            await patiently(lambda: self._enqueuer(request), self.reconnect_timeout)
        except BaseException as exc:
            with contextlib.suppress(*REDIS_ERRORS, redis.ResponseError):
                await self.redis.hdel(self.keys.job_record(request.job_id), event_log.DIGEST_FIELD)
            if isinstance(exc, REDIS_ERRORS) and not isinstance(exc, KvrelayError):
                raise self.connection_error(exc, f"enqueueing job {request.job_id}") from exc
            raise

    async def cancel(self, job_id: str) -> None:
        """Abort ``job_id`` wherever it is: queued jobs are dropped, running ones stopped."""
        async def send() -> None:
            pipe = self.redis.pipeline(transaction=False)
            pipe.set(self.keys.abort_flag(job_id), b"1", ex=ABORT_FLAG_TTL_S)
            pipe.publish(self.keys.control_channel,
                         encode_control(AbortMessage(job_id=job_id)))
            await self._replicated(pipe)

        try:
            await patiently(send, self.reconnect_timeout)
        except REDIS_ERRORS as exc:
            raise self.connection_error(exc, f"cancelling job {job_id}") from exc

    async def watch(self, job_id: str, token: str) -> None:
        """Count one more watcher of ``job_id``: its worker publishes on the job's own
        channel while any is left. ``token`` names the watching stream in the set of all
        of them (``Keyspace.watching``): while that set is empty, workers read no job's
        own count. Watching again with the same token adds no second member."""
        ttl_ms = int(WATCH_TTL_S * 1000)
        pipe = self.redis.pipeline(transaction=False)
        pipe.incr(self.keys.watchers(job_id))
        pipe.pexpire(self.keys.watchers(job_id), ttl_ms)
        pipe.sadd(self.keys.watching, token)
        pipe.pexpire(self.keys.watching, ttl_ms)
        await pipe.execute()
        self._watched[token] = job_id
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_watches())

    async def _refresh_watches(self) -> None:
        """Keep this client's watcher registrations alive while it has watching streams
        (they expire ``WATCH_TTL_S`` after the client stops: it left, or it died)."""
        while self._watched:
            await asyncio.sleep(WATCH_REFRESH_S)
            ttl_ms = int(WATCH_TTL_S * 1000)
            try:
                pipe = self.redis.pipeline(transaction=False)
                for job_id in set(self._watched.values()):
                    pipe.pexpire(self.keys.watchers(job_id), ttl_ms)
                pipe.pexpire(self.keys.watching, ttl_ms)
                await pipe.execute()
            except Exception as exc:  # Redis away: the next round tries again
                log.debug("could not refresh watcher registrations: %s", exc)

    def unwatch_soon(self, job_id: str, token: str) -> None:
        """One watcher fewer, in the background (callers may be leaving a ``finally``)."""
        self._watched.pop(token, None)
        self.spawn(self._unwatch_quietly(job_id, token))

    async def _unwatch_quietly(self, job_id: str, token: str) -> None:
        try:
            async def send() -> Any:
                pipe = self.redis.pipeline(transaction=False)
                await self.scripts.queue(pipe, UNWATCH,
                                         [self.keys.watchers(job_id), self.keys.watching],
                                         [token])
                return await pipe.execute()

            await self.scripts.retry_missing(send)
        except Exception as exc:
            log.debug("could not unwatch job %s: %s", job_id, exc)

    def release_quota(self, tenant: str, job_id: str, *, started: bool) -> None:
        """Take a job out of its tenant's counts (``kvrelay.tenant_quota``), in the
        background: out of the queued count once it started, out of both once it ended."""
        self.spawn(self._release_quietly(tenant, job_id, started))

    async def _release_quietly(self, tenant: str, job_id: str, started: bool) -> None:
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.zrem(self.keys.tenant_queued(tenant), job_id)
            if not started:
                pipe.zrem(self.keys.tenant_jobs(tenant), job_id)
            await pipe.execute()
        except Exception as exc:  # the entries expire at the job's deadline anyway
            log.debug("could not release job %s from tenant %s's counts: %s", job_id,
                      tenant, exc)

    def abort_soon(self, job_id: str) -> None:
        """Abort in the background: callers may be cancelled or leaving a ``finally``."""
        self.spawn(self._abort_quietly(job_id))

    async def _abort_quietly(self, job_id: str) -> None:
        try:
            await self.cancel(job_id)
        except Exception as exc:
            log.warning("could not abort job %s: %s", job_id, exc)

    # ------------------------------------------------------------------ live streams

    def track(self, stream: LiveStream) -> None:
        self._live.add(stream)

    def untrack(self, stream: LiveStream) -> None:
        self._live.discard(stream)
        if self._on_job_end is not None:
            self._on_job_end(stream.job_id, stream.worker)

    async def aclose(self) -> None:
        """Abort every unfinished stream and wait (briefly) for pending aborts."""
        for stream in list(self._live):
            await stream.aclose()
        if self._refresher is not None:
            self._refresher.cancel()
        if self._background:
            await asyncio.wait(list(self._background), timeout=5.0)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background; ``aclose`` waits for it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ registry

    async def workers(self) -> list[WorkerInfo]:
        """Live workers (dead entries are removed from the registry on the way)."""
        async def read() -> list[WorkerInfo]:
            try:
                return await live_workers(self.redis, self.keys)
            except Exception as exc:
                if passing(exc):  # out of reach or failing over: the registry may lag
                    self._served.unreachable()
                raise

        try:
            workers = await patiently(read, self.reconnect_timeout)
        except REDIS_ERRORS as exc:
            raise self.connection_error(exc, "reading the worker registry") from exc
        self._served.update(served_models(workers), pool_primary(self.redis.connection_pool))
        self._payload_limits = payload_limits(workers)
        self._adapters = served_adapters(workers)
        return workers

    async def _read_workers(self) -> frozenset[str]:
        return served_models(await self.workers())

    async def queue_length(self, model: str) -> int:
        """Jobs waiting in ``model``'s queue (not counting those being run)."""
        try:
            return int(await patiently(lambda: self.redis.llen(self.keys.queue(model)),
                                       self.reconnect_timeout))
        except REDIS_ERRORS as exc:
            raise self.connection_error(exc, "reading the queue length") from exc

    async def _replicated(self, pipe: Any) -> list[Any]:
        """Execute a pipeline of writes, closed by a ``WAIT`` for the replicas behind
        sentinels (its reply left out, judged by the server that carried the writes);
        raises the first error reply."""
        return await self._replica_wait.aexecute(pipe)

    async def judged_read(self, pipe: Any) -> list[Any]:
        """Execute a pipeline of reads, closed by the ``WAIT`` its primary wants and
        judged by the server that answered (``kvrelay.judged_read``): raises
        ``PrimaryInDoubt`` for a read a replaced primary answered."""
        return await judged_run(self._replica_wait, pipe)

    def connection_error(self, exc: BaseException, doing: str) -> KvrelayError:
        """``kvrelay.BrokerUnavailable`` naming this client's server and what it did."""
        return connection_error(self._where, doing, exc)
