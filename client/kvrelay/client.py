"""``AsyncClient``: enqueue generation jobs and stream their events back.

One client holds: a bounded pool of command connections (admission checks, log reads,
aborts), one shared pub/sub connection (the ``Dispatcher``) for all its streams, and a
few enqueue threads running Celery's producer. Create it once per process and share it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Unpack

from redis.asyncio import Redis

from kvrelay.adapter_admin import AdapterAdmin
from kvrelay.async_resource import AsyncResource
from kvrelay.completion import Completion
from kvrelay.config_values import count, seconds
from kvrelay.connection import REDIS_ERRORS, make_redis, redact_url, resolve_url
from kvrelay.dispatcher import Dispatcher
from kvrelay.enqueue import CeleryEnqueuer, Enqueuer
from kvrelay.errors import InvalidRequest, KvrelayError, UnknownJob
from kvrelay.job_lifecycle import ABORT_FLAG_TTL_S, JobLifecycle
from kvrelay.job_lookup import is_known
from kvrelay.keys import Keyspace, NamespaceError
from kvrelay.prefix_placement import PrefixPlacement, placement_enabled
from kvrelay.primary_watch import PrimaryWatchedTransport
from kvrelay.protocol import DEFAULT_MAX_PAYLOAD_BYTES, WorkerInfo
from kvrelay.pubsub_transport import RedisPyTransport, Transport, TransportFactory
from kvrelay.queue_depth import ModelQueue, QueueDepthReader
from kvrelay.replica_wait import ReplicaWait
from kvrelay.request_builder import (
    MAX_JOB_ID_LENGTH,
    GenerateOptions,
    build_request,
    queue_timeout_value,
)
from kvrelay.resp import Endpoint, RespConnection
from kvrelay.sentinel_url import (
    SentinelUrl,
    SentinelUrlError,
    is_sentinel_url,
    parse_sentinel_url,
)
from kvrelay.stream import AsyncStream
from kvrelay.stream_mailbox import DEFAULT_STREAM_BUFFER_BYTES
from kvrelay.tls import TlsConfigError, celery_ssl_options

__all__ = ["ABORT_FLAG_TTL_S", "AsyncClient"]


class AsyncClient(AsyncResource):
    """Async client for kvrelay workers.

    Args:
        url: Redis URL shared with the workers (``redis://``, ``rediss://``, ``unix://``,
            or ``redis+sentinel://host:26379,.../<master-name>``: see ``kvrelay.sentinel_url``);
            None (the default) reads ``$KVRELAY_REDIS_URL``, else ``redis://localhost:6379/0``.
        model: default model for calls that do not name one.
        stream_timeout: seconds without any event of a job before ``StreamTimeout``
            (the job is then aborted); per call: ``stream_timeout=``.
        max_queue: refuse to enqueue (``QueueFull``) while the model's queue holds more
            than this many jobs; None for the workers' limit alone (``KVRELAY_MAX_QUEUE``,
            checked atomically with the push, whatever the client).
        queue_timeout: seconds a job may wait in the queue for a worker (at most
            ``MAX_QUEUE_TIMEOUT_S``, 3000); past it no worker starts it and the call raises
            ``QueueTimeout``. None: as long as ``stream_timeout``. Per call: ``queue_timeout=``.
        require_worker: refuse (``UnknownModel``) a model no live worker announces;
            False lets jobs wait in the queue for workers that are not up yet.
        connect_timeout: seconds to establish a connection.
        reconnect_timeout: how long live streams survive an unreachable Redis before
            failing with ``kvrelay.BrokerUnavailable``.
        health_check_interval: idle seconds before the pub/sub connection is PINGed.
        enqueue_threads: threads publishing to Celery concurrently.
        max_connections: size of the command connection pool.
        redis: an existing ``redis.asyncio.Redis`` (bytes replies) to use instead of
            ``url`` (e.g. fakeredis in tests); the caller keeps ownership.
        namespace: the tenant: every key, channel and queue this client uses starts
            with its prefix (``kvrelay:ns:<namespace>:``); workers of the same
            namespace (``KVRELAY_NAMESPACE``) serve it. Empty: the default ``kvrelay:``.
        placement: prefix-aware placement (``kvrelay.prefix_placement``): a job goes to the
            queue of the worker that served its prompt's prefix recently, when that worker
            has room. None: ``$KVRELAY_PLACEMENT`` (off unless true); False: every job
            goes to the model's shared queue.
        placement_load_cap: a worker takes placed jobs while its running and own-queued
            jobs stay under this multiple of its concurrency.
        stream_buffer_bytes: a stream's events received and not yet read, at most: a
            reader further behind gets ``kvrelay.errors.SlowReader`` and its job is
            aborted (the client's memory stays bounded whatever its readers do).
        enqueuer: replaces the Celery producer (testing hook); it marks the job's
            record enqueued (``event_log.ENQUEUED_FIELD``) as the Celery push does, or a
            retry of the same ``job_id`` pushes the job again.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        model: str | None = None,
        stream_timeout: float = 60.0,
        max_queue: int | None = None,
        queue_timeout: float | None = None,
        require_worker: bool = True,
        connect_timeout: float = 5.0,
        reconnect_timeout: float = 30.0,
        health_check_interval: float = 10.0,
        enqueue_threads: int = 2,
        max_connections: int = 64,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        redis: Redis | None = None,
        enqueuer: Enqueuer | None = None,
        namespace: str = "",
        placement: bool | None = None,
        placement_load_cap: float = 1.0,
        stream_buffer_bytes: int = DEFAULT_STREAM_BUFFER_BYTES,
    ) -> None:
        stream_timeout = seconds("stream_timeout", stream_timeout)
        connect_timeout = seconds("connect_timeout", connect_timeout)
        reconnect_timeout = seconds("reconnect_timeout", reconnect_timeout)
        health_check_interval = seconds("health_check_interval", health_check_interval)
        if (isinstance(placement_load_cap, bool)
                or not isinstance(placement_load_cap, (int, float))
                or not math.isfinite(placement_load_cap) or placement_load_cap <= 0):
            raise InvalidRequest(f"placement_load_cap must be a finite number > 0, got "
                                 f"{placement_load_cap!r}")
        if max_queue is not None:
            max_queue = count("max_queue", max_queue, minimum=0)
        enqueue_threads = count("enqueue_threads", enqueue_threads, minimum=1)
        max_connections = count("max_connections", max_connections, minimum=1)
        max_payload_bytes = count("max_payload_bytes", max_payload_bytes, minimum=1)
        stream_buffer_bytes = count("stream_buffer_bytes", stream_buffer_bytes, minimum=1)
        url = resolve_url(url)
        try:
            self._keys = Keyspace(namespace)
            celery_ssl_options(url)
            sentinel = parse_sentinel_url(url) if is_sentinel_url(url) else None
        except (NamespaceError, TlsConfigError, SentinelUrlError) as exc:
            raise InvalidRequest(str(exc)) from None
        self._url = url
        self._sentinel_mode = sentinel is not None
        self._resolver: object = None
        self._where = redact_url(url) if redis is None else "<injected client>"
        self._model = model
        self._stream_timeout = float(stream_timeout)
        self._queue_timeout = None if queue_timeout is None else queue_timeout_value(queue_timeout)
        self._max_payload_bytes = max_payload_bytes
        self._owns_redis = redis is None
        self._redis: Redis = (
            redis
            if redis is not None
            else make_redis(url, max_connections=max_connections, connect_timeout=connect_timeout)
        )
        transport_factory: TransportFactory
        if redis is None:
            resolve_endpoint = _endpoint_resolver(url, sentinel, connect_timeout)
            self._resolver = resolve_endpoint

            watch_primary = sentinel is not None

            async def open_resp() -> Transport:
                endpoint = await resolve_endpoint()
                connection = await RespConnection.open(
                    endpoint, connect_timeout=connect_timeout, client_name="kvrelay-client-sub"
                )
                if watch_primary:  # leave a primary the sentinels replaced
                    return PrimaryWatchedTransport(connection, endpoint, self._named_primary)
                return connection

            transport_factory = open_resp
        else:
            injected = redis

            async def open_redis_py() -> Transport:
                return await RedisPyTransport.open(injected)

            transport_factory = open_redis_py
        self._dispatcher = Dispatcher(
            transport_factory,
            where=self._where,
            reconnect_timeout=reconnect_timeout,
            health_check_interval=health_check_interval,
            subscribe_timeout=connect_timeout + reconnect_timeout,
        )
        self._celery: CeleryEnqueuer | None = None
        placer: PrefixPlacement | None = None
        if enqueuer is None and placement_enabled(placement):
            placer = PrefixPlacement(self._redis, self._keys, load_cap=placement_load_cap)
        if enqueuer is None:
            self._celery = CeleryEnqueuer(
                url,
                threads=enqueue_threads,
                connect_timeout=connect_timeout,
                where=self._where,
                max_queue=max_queue,
                keyspace=self._keys,
                placement=placer,
            )
            enqueuer = self._celery
        self._jobs = JobLifecycle(
            self._redis,
            self._dispatcher,
            enqueuer,
            where=self._where,
            require_worker=require_worker,
            # The Celery enqueuer checks max_queue atomically with each push; an injected
            # one bypasses that, so the lifecycle checks the queue's length first instead.
            max_queue=max_queue if self._celery is None else None,
            keys=self._keys,
            max_payload_bytes=max_payload_bytes,
            stream_buffer_bytes=stream_buffer_bytes,
            on_job_end=placer.job_ended if placer is not None else None,
            reconnect_timeout=reconnect_timeout,
            replica_wait=(ReplicaWait(sentinel.wait_replicas, sentinel.wait_timeout_ms)
                          if sentinel is not None else None),
        )
        # Created at the first ``queue_depths``: it keeps its queue scan's place.
        self._queue_depth: QueueDepthReader | None = None
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def _named_primary(self) -> Endpoint:
        """The primary the sentinels name now, asked through the command pool: a pool
        that finds it replaced drops its idle connections to the old one, so the log
        reads that fill a stream's gap go to the new primary too."""
        host, port = await self._redis.connection_pool.get_master_address()  # type: ignore[attr-defined]
        return Endpoint(host=str(host), port=int(port))

    async def _open(self) -> None:
        await self.connect()

    async def connect(self) -> None:
        """Check that Redis answers (fail fast with a clear error); warm the producer."""
        self._check_open()
        try:
            await self._redis.ping()
        except REDIS_ERRORS as exc:
            raise self._jobs.connection_error(exc, "connecting") from exc
        if self._celery is not None:
            self._jobs.spawn(self._celery.start_warm_up())

    async def ping(self) -> None:
        """Raise ``BrokerUnavailable`` unless Redis answers (one PING)."""
        self._check_open()
        try:
            await self._redis.ping()
        except REDIS_ERRORS as exc:
            raise self._jobs.connection_error(exc, "checking Redis") from exc

    async def aclose(self) -> None:
        """Abort unfinished streams, flush pending aborts, close every connection."""
        if self._closed:
            return
        self._closed = True
        await self._jobs.aclose()
        await self._dispatcher.aclose()
        if self._celery is not None:
            await self._celery.aclose()
        if self._owns_redis:
            await self._redis.aclose()
            if self._sentinel_mode:
                await _close_sentinel_links(self._redis, self._resolver)

    close = aclose

    def _check_open(self) -> None:
        if self._closed:
            raise KvrelayError("the client is closed")

    # ------------------------------------------------------------------ generation

    async def generate(
        self, prompt: str | None = None, **options: Unpack[GenerateOptions]
    ) -> Completion:
        """Run one job to completion. Cancelling this call aborts the job."""
        async with self.stream(prompt, **options) as stream:
            return await stream.final()

    def stream(self, prompt: str | None = None, **options: Unpack[GenerateOptions]) -> AsyncStream:
        """A stream for a new job; nothing is sent until it is entered or iterated.

        The request is validated here, so bad arguments raise ``InvalidRequest`` at once.
        """
        self._check_open()
        request, settings = build_request(
            prompt, options, default_model=self._model, max_payload_bytes=self._max_payload_bytes
        )
        return AsyncStream(
            self._jobs,
            job_id=request.job_id,
            request=request,
            stream_timeout=settings.stream_timeout or self._stream_timeout,
            timeout=settings.timeout,
            queue_timeout=settings.queue_timeout or self._queue_timeout,
        )

    async def resume(
        self,
        job_id: str,
        *,
        after_seq: int = -1,
        stream_timeout: float | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the job's limit, like generate's
        abort_on_exit: bool = False,
        keep_output: bool = True,
    ) -> AsyncStream:
        """Continue a job's stream after the event with seq ``after_seq``.

        Events up to ``after_seq`` are not yielded again but still count in ``final()``.
        The stream is started (subscribed, log read) when this returns. It observes: leaving
        it early leaves the job running, unless ``abort_on_exit=True``. A job with no trace
        left (never enqueued, or its log expired) raises ``UnknownJob`` at once.
        ``keep_output=False``: ``final()`` holds no tokens or text (``discard_output``).
        """
        self._check_open()
        if not isinstance(job_id, str) or not job_id or len(job_id) > MAX_JOB_ID_LENGTH:
            raise InvalidRequest("job_id must be a non-empty str")
        if isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < -1:
            raise InvalidRequest("after_seq must be an int >= -1")
        if stream_timeout is not None:
            stream_timeout = seconds("stream_timeout", stream_timeout)
        if timeout is not None:
            timeout = seconds("timeout", timeout)
        await self._check_known(job_id)
        stream = AsyncStream(
            self._jobs,
            job_id=job_id,
            request=None,
            stream_timeout=stream_timeout or self._stream_timeout,
            timeout=timeout,
            after_seq=after_seq,
            abort_on_exit=abort_on_exit,
            keep_output=keep_output,
            still_known=functools.partial(is_known, self._jobs, job_id, self._model),
        )
        await stream.start()
        return stream

    async def _check_known(self, job_id: str) -> None:
        """``UnknownJob`` unless the job is queued (for a served or the default model),
        taken by a worker, running, or still has its log."""
        try:
            known = await is_known(self._jobs, job_id, self._model)
        except REDIS_ERRORS as exc:
            raise self._jobs.connection_error(exc, f"looking up job {job_id}") from exc
        if not known:
            raise UnknownJob(
                "no such job: it was never enqueued, or it ended more than KVRELAY_LOG_TTL "
                "(1 h by default) ago and its log expired",
                job_id=job_id,
            )

    async def cancel(self, job_id: str) -> None:
        """Abort ``job_id`` wherever it is: queued jobs are dropped, running ones stopped."""
        await self._jobs.cancel(job_id)

    # ------------------------------------------------------------------ registry

    async def workers(self) -> list[WorkerInfo]:
        """Live workers (dead entries are removed from the registry on the way)."""
        return await self._jobs.workers()

    async def queue_length(self, model: str | None = None) -> int:
        """Jobs waiting in ``model``'s queue (not counting those being run)."""
        name = model or self._model
        if not name:
            raise InvalidRequest("no model: pass model=... to the client or to this call")
        return await self._jobs.queue_length(name)

    async def queue_depths(self, models: Iterable[str] = ()) -> list[ModelQueue]:
        """Per model, the jobs waiting for it (its Redis queues and its live workers'
        engines): the models live workers serve, ``models``, and queues nobody serves,
        found by a bounded scan (``kvrelay.queue_depth``). Each call costs a few round
        trips, whatever the size of the keyspace."""
        self._check_open()
        if self._queue_depth is None:
            self._queue_depth = QueueDepthReader(self._redis, self._keys)
        try:
            return await self._queue_depth.read(models)
        except REDIS_ERRORS as exc:
            raise self._jobs.connection_error(exc, "reading the queue depths") from exc

    @property
    def adapters(self) -> AdapterAdmin:
        """Load, unload and list the LoRA adapters of live workers (docs/adapters.md)."""
        self._check_open()
        return AdapterAdmin(self._jobs, default_model=self._model)

    @property
    def dispatcher(self) -> Dispatcher:
        """The shared pub/sub reader (exposed for diagnostics and tests)."""
        return self._dispatcher

    @property
    def reply_channel(self) -> str:
        """The channel the events of every job this client starts arrive on."""
        return self._jobs.reply_channel

    def __repr__(self) -> str:
        return f"AsyncClient({self._where!r}, model={self._model!r})"


def _endpoint_resolver(url: str, sentinel: SentinelUrl | None,
                       connect_timeout: float) -> Callable[[], Awaitable[Endpoint]]:
    """Where the pub/sub connection goes: fixed for a plain URL; for a Sentinel URL the
    primary the sentinels name at each (re)connect, so streams follow a failover."""
    if sentinel is not None:
        from kvrelay.sentinel_connect import SentinelEndpoints

        return SentinelEndpoints(sentinel, connect_timeout)
    endpoint = Endpoint.from_url(url)

    async def fixed() -> Endpoint:
        return endpoint

    return fixed


async def _close_sentinel_links(redis: Redis, resolver: object) -> None:
    """Sentinel mode: the connections to the sentinels, which redis-py leaves open."""
    from kvrelay.sentinel_connect import SentinelEndpoints, close_sentinels

    manager = getattr(redis.connection_pool, "sentinel_manager", None)
    if manager is not None:
        await close_sentinels(manager)
    if isinstance(resolver, SentinelEndpoints):
        await resolver.aclose()
