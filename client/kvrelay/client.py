"""``AsyncClient``: enqueue generation jobs and stream their events back.

One client holds: a bounded pool of command connections (admission checks, log reads,
aborts), one shared pub/sub connection (the ``Dispatcher``) for all its streams, and a
few enqueue threads running Celery's producer. Create it once per process and share it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Final, Unpack

from redis.asyncio import Redis

from kvrelay.completion import Completion
from kvrelay.connection import REDIS_ERRORS, connection_error, make_redis, redact_url
from kvrelay.dispatcher import Dispatcher, RedisPyTransport, Transport, TransportFactory
from kvrelay.enqueue import CeleryEnqueuer, Enqueuer
from kvrelay.errors import InvalidRequest, KvrelayError, PayloadTooLarge, QueueFull, UnknownModel
from kvrelay.keys import Keyspace, NamespaceError
from kvrelay.protocol import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    AbortMessage,
    GenerateRequest,
    WorkerInfo,
    encode_control,
    encode_request,
)
from kvrelay.request_builder import MAX_JOB_ID_LENGTH, GenerateOptions, build_request
from kvrelay.resp import Endpoint, RespConnection
from kvrelay.stream import AsyncStream, StreamContext
from kvrelay.tls import TlsConfigError, celery_ssl_options
from kvrelay.workers import live_workers, payload_limits, served_models

__all__ = ["ABORT_FLAG_TTL_S", "AsyncClient"]

log = logging.getLogger("kvrelay.client")

# How long an abort flag outlives the request to cancel (covers a long queue wait).
ABORT_FLAG_TTL_S: Final = 3600
# How long the answer "which models have live workers" is reused.
_SERVED_MODELS_TTL_S: Final = 1.0
# A model missing from an answer older than this is looked up again before refusing.
_SERVED_MODELS_RECHECK_S: Final = 0.1


class AsyncClient:
    """Async client for kvrelay workers.

    Args:
        url: Redis URL shared with the workers (``redis://``, ``rediss://``, ``unix://``).
        model: default model for calls that do not name one.
        stream_timeout: seconds without any event of a job before ``StreamTimeout``
            (the job is then aborted); per call: ``stream_timeout=``.
        max_queue: refuse to enqueue (``QueueFull``) while the model's queue holds more
            than this many jobs; None for no limit.
        require_worker: refuse (``UnknownModel``) a model no live worker announces;
            False lets jobs wait in the queue for workers that are not up yet.
        connect_timeout: seconds to establish a connection.
        reconnect_timeout: how long live streams survive an unreachable Redis before
            failing with ``kvrelay.ConnectionError``.
        health_check_interval: idle seconds before the pub/sub connection is PINGed.
        enqueue_threads: threads publishing to Celery concurrently.
        max_connections: size of the command connection pool.
        redis: an existing ``redis.asyncio.Redis`` (bytes replies) to use instead of
            ``url`` (e.g. fakeredis in tests); the caller keeps ownership.
        namespace: the tenant: every key, channel and queue this client uses starts
            with its prefix (``kvrelay:ns:<namespace>:``); workers of the same
            namespace (``KVRELAY_NAMESPACE``) serve it. Empty: the default ``kvrelay:``.
        enqueuer: replaces the Celery producer (testing hook).
    """

    def __init__(
        self,
        url: str = "redis://localhost:6379/0",
        *,
        model: str | None = None,
        stream_timeout: float = 60.0,
        max_queue: int | None = None,
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
    ) -> None:
        if stream_timeout <= 0:
            raise InvalidRequest("stream_timeout must be > 0")
        if max_queue is not None and (isinstance(max_queue, bool) or max_queue < 0):
            raise InvalidRequest("max_queue must be None or an int >= 0")
        try:
            self._keys = Keyspace(namespace)
            celery_ssl_options(url)
        except (NamespaceError, TlsConfigError) as exc:
            raise InvalidRequest(str(exc)) from None
        self._url = url
        self._where = redact_url(url) if redis is None else "<injected client>"
        self._model = model
        self._stream_timeout = float(stream_timeout)
        self._max_queue = max_queue
        self._require_worker = require_worker
        self._max_payload_bytes = max_payload_bytes
        self._owns_redis = redis is None
        self._redis: Redis = (
            redis
            if redis is not None
            else make_redis(url, max_connections=max_connections, connect_timeout=connect_timeout)
        )
        transport_factory: TransportFactory
        if redis is None:
            endpoint = Endpoint.from_url(url)

            async def open_resp() -> Transport:
                return await RespConnection.open(
                    endpoint, connect_timeout=connect_timeout, client_name="kvrelay-client-sub"
                )

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
        if enqueuer is None:
            self._celery = CeleryEnqueuer(
                url,
                threads=enqueue_threads,
                connect_timeout=connect_timeout,
                where=self._where,
                keyspace=self._keys,
            )
            enqueuer = self._celery
        self._enqueuer: Enqueuer = enqueuer
        self._ctx = StreamContext(
            redis=self._redis,
            keys=self._keys,
            dispatcher=self._dispatcher,
            admit=self._admit,
            enqueue=self._enqueuer,
            abort=self._abort_soon,
            connection_error=self._connection_error,
            track=self._track,
            untrack=self._untrack,
        )
        self._live: weakref.WeakSet[AsyncStream] = weakref.WeakSet()
        self._background: set[asyncio.Task[None]] = set()
        self._served: frozenset[str] | None = None
        self._served_at = 0.0
        self._served_refresh: asyncio.Task[frozenset[str]] | None = None
        # Per model: the smallest payload limit its live workers advertise.
        self._payload_limits: dict[str, int] = {}
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Check that Redis answers (fail fast with a clear error); warm the producer."""
        self._check_open()
        try:
            await self._redis.ping()
        except REDIS_ERRORS as exc:
            raise self._connection_error(exc, "connecting") from exc
        if self._celery is not None:
            self._spawn(self._celery.start_warm_up())

    async def aclose(self) -> None:
        """Abort unfinished streams, flush pending aborts, close every connection."""
        if self._closed:
            return
        self._closed = True
        for stream in list(self._live):
            await stream.aclose()
        if self._background:
            await asyncio.wait(list(self._background), timeout=5.0)
        await self._dispatcher.aclose()
        if self._celery is not None:
            await self._celery.aclose()
        if self._owns_redis:
            await self._redis.aclose()

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
            self._ctx,
            job_id=request.job_id,
            request=request,
            stream_timeout=settings.stream_timeout or self._stream_timeout,
            timeout=settings.timeout,
        )

    async def resume(
        self,
        job_id: str,
        *,
        after_seq: int = -1,
        stream_timeout: float | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the job's limit, like generate's
    ) -> AsyncStream:
        """Continue a job's stream after the event with seq ``after_seq``.

        Events up to ``after_seq`` are not yielded again but still count in ``final()``.
        The stream is started (subscribed, log read) when this returns.
        """
        self._check_open()
        if not isinstance(job_id, str) or not job_id or len(job_id) > MAX_JOB_ID_LENGTH:
            raise InvalidRequest("job_id must be a non-empty str")
        if isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < -1:
            raise InvalidRequest("after_seq must be an int >= -1")
        if stream_timeout is not None and stream_timeout <= 0:
            raise InvalidRequest("stream_timeout must be > 0")
        if timeout is not None and timeout <= 0:
            raise InvalidRequest("timeout must be > 0")
        stream = AsyncStream(
            self._ctx,
            job_id=job_id,
            request=None,
            stream_timeout=stream_timeout or self._stream_timeout,
            timeout=timeout,
            after_seq=after_seq,
        )
        await stream.start()
        return stream

    async def cancel(self, job_id: str) -> None:
        """Abort ``job_id`` wherever it is: queued jobs are dropped, running ones stopped."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._keys.abort_flag(job_id), b"1", ex=ABORT_FLAG_TTL_S)
        pipe.publish(self._keys.control_channel, encode_control(AbortMessage(job_id=job_id)))
        try:
            await pipe.execute()
        except REDIS_ERRORS as exc:
            raise self._connection_error(exc, f"cancelling job {job_id}") from exc

    # ------------------------------------------------------------------ registry

    async def workers(self) -> list[WorkerInfo]:
        """Live workers (dead entries are removed from the registry on the way)."""
        try:
            workers = await live_workers(self._redis, self._keys)
        except REDIS_ERRORS as exc:
            raise self._connection_error(exc, "reading the worker registry") from exc
        self._served = served_models(workers)
        self._served_at = asyncio.get_running_loop().time()
        self._payload_limits = payload_limits(workers)
        return workers

    async def queue_length(self, model: str | None = None) -> int:
        """Jobs waiting in ``model``'s queue (not counting those being run)."""
        name = model or self._model
        if not name:
            raise InvalidRequest("no model: pass model=... to the client or to this call")
        try:
            return int(await self._redis.llen(self._keys.queue(name)))
        except REDIS_ERRORS as exc:
            raise self._connection_error(exc, "reading the queue length") from exc

    # ------------------------------------------------------------------ internals

    async def _served_models(self, max_age: float) -> frozenset[str]:
        """Models with a live worker; one registry read serves concurrent callers."""
        loop = asyncio.get_running_loop()
        if self._served is not None and loop.time() - self._served_at < max_age:
            return self._served
        if self._served_refresh is None or self._served_refresh.done():

            async def refresh() -> frozenset[str]:
                return served_models(await self.workers())

            self._served_refresh = loop.create_task(refresh())
        return await asyncio.shield(self._served_refresh)

    async def _admit(self, request: GenerateRequest) -> None:
        """Refuse before enqueueing: no worker for the model, or its queue too long."""
        model = request.model
        if self._require_worker:
            served = await self._served_models(_SERVED_MODELS_TTL_S)
            if model not in served:
                served = await self._served_models(_SERVED_MODELS_RECHECK_S)
            if model not in served:
                listing = ", ".join(sorted(served)) if served else "none"
                raise UnknownModel(
                    f"no live worker serves model {model!r} (models served: {listing}); "
                    "pass require_worker=False to enqueue ahead of the workers"
                )
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
        await self._served_models(_SERVED_MODELS_TTL_S)
        limit = self._payload_limits.get(request.model, DEFAULT_MAX_PAYLOAD_BYTES)
        if size > limit:
            raise PayloadTooLarge(
                f"request is {size} bytes of JSON; the workers of model {request.model!r} "
                f"accept at most {limit}",
                job_id=request.job_id,
            )

    def _abort_soon(self, job_id: str) -> None:
        """Abort in the background: callers may be cancelled or leaving a ``finally``."""
        self._spawn(self._abort_quietly(job_id))

    async def _abort_quietly(self, job_id: str) -> None:
        try:
            await self.cancel(job_id)
        except Exception as exc:
            log.warning("could not abort job %s: %s", job_id, exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        loop = asyncio.get_running_loop()
        task = loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _connection_error(self, exc: BaseException, doing: str) -> KvrelayError:
        return connection_error(self._where, doing, exc)

    def _track(self, stream: AsyncStream) -> None:
        self._live.add(stream)

    def _untrack(self, stream: AsyncStream) -> None:
        self._live.discard(stream)

    @property
    def dispatcher(self) -> Dispatcher:
        """The shared pub/sub reader (exposed for diagnostics and tests)."""
        return self._dispatcher

    def __repr__(self) -> str:
        return f"AsyncClient({self._where!r}, model={self._model!r})"
