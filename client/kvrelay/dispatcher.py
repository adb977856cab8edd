"""One pub/sub connection for all of a client's streams.

A single reader task owns the subscriber connection (a ``Transport``,
``kvrelay.pubsub_transport``). A message packs the events of one or more jobs
(``kvrelay.event_frames``): the reader splits it by job and drops each job's events, still
encoded, into the ``Mailbox`` (``kvrelay.stream_mailbox``) of every stream of that job: no
event decoding, no Redis round trip. Streams of jobs this client started listen on its
reply channel (``Keyspace.reply_channel``), subscribed once; a stream watching another
client's job listens on the job's own channel. A stream is ready once Redis has confirmed
its channel; subscribes and unsubscribes made in the same loop iteration go out as one
command.

If the connection drops, the reader reconnects with backoff, resubscribes every live
channel and, once Redis confirms each one, puts a ``RESYNC`` marker in its mailboxes so
the stream re-reads the job's log from its last seq (events published while we were
away are there). If Redis stays unreachable for ``reconnect_timeout`` seconds, every
live stream fails with ``kvrelay.BrokerUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

import msgspec

from kvrelay.errors import BrokerUnavailable, KvrelayError
from kvrelay.event_frames import unpack_message
from kvrelay.pubsub_transport import RedisPyTransport, Transport, TransportFactory
from kvrelay.resp import Frame, RespError, TransportLost
from kvrelay.stream_mailbox import DEFAULT_STREAM_BUFFER_BYTES, RESYNC, Mailbox

# The transport and mailbox names are re-exported: callers and tests import them from here.
__all__ = [
    "DEFAULT_STREAM_BUFFER_BYTES",
    "RESYNC",
    "Dispatcher",
    "Mailbox",
    "RedisPyTransport",
    "Transport",
    "TransportFactory",
]

log = logging.getLogger("kvrelay.dispatcher")


class _Channel:
    """Subscription state of one channel.

    ``expected`` holds one entry per SUBSCRIBE/UNSUBSCRIBE sent and not yet acknowledged,
    in send order (Redis acknowledges in order): the future to resolve for a SUBSCRIBE,
    None for an UNSUBSCRIBE.
    """

    __slots__ = ("expected", "mailboxes", "name", "ready", "resync", "sent")

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.mailboxes: list[Mailbox] = []
        self.expected: deque[asyncio.Future[None] | None] = deque()
        self.sent = False  # what we last told the server: subscribed or not
        self.ready: asyncio.Future[None] | None = None
        self.resync = False


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark a failed future's exception as seen (nobody may be awaiting it)."""
    if not future.cancelled():
        future.exception()


class Dispatcher:
    """The shared subscriber: a mailbox per stream, routed by job id; one reader task,
    reconnects."""

    def __init__(
        self,
        transport_factory: TransportFactory,
        *,
        where: str,
        reconnect_timeout: float = 30.0,
        health_check_interval: float = 10.0,
        subscribe_timeout: float = 30.0,
    ) -> None:
        self._factory = transport_factory
        self._where = where
        self._reconnect_timeout = reconnect_timeout
        self._health_interval = health_check_interval
        self._subscribe_timeout = subscribe_timeout
        self._channels: dict[bytes, _Channel] = {}
        # Mailboxes by job id: where a message's pairs go, whatever channel brought them.
        self._jobs: dict[str, list[Mailbox]] = {}
        self._dirty: set[bytes] = set()
        self._transport: Transport | None = None
        self._reader: asyncio.Task[None] | None = None
        self._flush_scheduled = False
        self._flush_lock: asyncio.Lock | None = None
        self._flush_tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # Counters for tests and diagnostics.
        self.connects = 0
        self.messages = 0
        self.unreadable = 0

    # ------------------------------------------------------------------ public API

    @property
    def connected(self) -> bool:
        return self._transport is not None

    @property
    def live_channels(self) -> int:
        return sum(1 for ch in self._channels.values() if ch.mailboxes)

    async def subscribe(self, job_id: str, channel: str, *,
                        max_bytes: int | None = None) -> Mailbox:
        """A mailbox for the events of ``job_id`` arriving on ``channel`` (and on any other
        channel this client listens to), returned once Redis has confirmed ``channel``;
        holding at most ``max_bytes`` of events not yet read (None: no bound)."""
        if self._closed:
            raise KvrelayError("the client is closed")
        loop = asyncio.get_running_loop()
        name = channel.encode()
        mailbox = Mailbox(job_id, name, max_bytes)
        ch = self._channels.get(name)
        if ch is None:
            ch = self._channels[name] = _Channel(name)
        ch.mailboxes.append(mailbox)
        self._jobs.setdefault(job_id, []).append(mailbox)
        if ch.ready is None:
            ch.ready = loop.create_future()
            ch.ready.add_done_callback(_retrieve)
        ready = ch.ready
        self._dirty.add(name)
        self._schedule_flush()
        self._ensure_reader()
        try:
            async with asyncio.timeout(self._subscribe_timeout):
                await asyncio.shield(ready)
        except TimeoutError:
            self.unsubscribe(mailbox)
            raise BrokerUnavailable(
                f"Redis at {self._where} did not confirm a subscription within "
                f"{self._subscribe_timeout:g}s"
            ) from None
        except BaseException:
            self.unsubscribe(mailbox)
            raise
        return mailbox

    def unsubscribe(self, mailbox: Mailbox) -> None:
        """Stop delivering to ``mailbox``; the channel is released when nobody is left."""
        mailbox.close()
        routed = self._jobs.get(mailbox.job_id)
        if routed is not None:
            with contextlib.suppress(ValueError):
                routed.remove(mailbox)
            if not routed:
                del self._jobs[mailbox.job_id]
        ch = self._channels.get(mailbox.channel)
        if ch is None:
            return
        with contextlib.suppress(ValueError):
            ch.mailboxes.remove(mailbox)
        if not ch.mailboxes:
            self._dirty.add(ch.name)
            self._schedule_flush()

    async def aclose(self) -> None:
        """Stop the reader, close the connection, fail whatever still listens."""
        if self._closed:
            return
        self._closed = True
        reader, self._reader = self._reader, None
        # Some awaitables (``asyncio.wait_for`` on 3.11, inside redis-py/fakeredis) can
        # swallow a cancel that races with their own completion: insist, briefly.
        for _ in range(20):
            if reader is None or reader.done():
                break
            reader.cancel()
            await asyncio.wait({reader}, timeout=0.05)
        if reader is not None and reader.done() and not reader.cancelled():
            reader.exception()
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.aclose()
        for task in list(self._flush_tasks):
            task.cancel()
        self._fail_all(KvrelayError, "the client was closed")

    # ------------------------------------------------------------------ flushing

    def _schedule_flush(self) -> None:
        if self._flush_scheduled or self._transport is None:
            return
        self._flush_scheduled = True
        asyncio.get_running_loop().call_soon(self._start_flush)

    def _start_flush(self) -> None:
        task = asyncio.get_running_loop().create_task(self._flush())
        self._flush_tasks.add(task)
        task.add_done_callback(self._flush_tasks.discard)

    async def _flush(self) -> None:
        """Send one SUBSCRIBE and one UNSUBSCRIBE for everything that changed."""
        if self._flush_lock is None:
            self._flush_lock = asyncio.Lock()
        async with self._flush_lock:
            self._flush_scheduled = False
            transport = self._transport
            if transport is None or not self._dirty:
                return
            subs: list[bytes] = []
            unsubs: list[bytes] = []
            for name in self._dirty:
                ch = self._channels.get(name)
                if ch is None:
                    continue
                if ch.mailboxes and not ch.sent:
                    ch.sent = True
                    ch.expected.append(ch.ready)
                    subs.append(name)
                elif not ch.mailboxes and ch.sent:
                    ch.sent = False
                    ch.ready = None
                    ch.expected.append(None)
                    unsubs.append(name)
                elif not ch.mailboxes and not ch.expected:
                    del self._channels[name]
            self._dirty.clear()
            try:
                if unsubs:
                    await transport.unsubscribe(unsubs)
                if subs:
                    await transport.subscribe(subs)
            except Exception as exc:  # the reader notices the loss and resubscribes all
                log.debug("pub/sub write failed: %s", exc)

    # ------------------------------------------------------------------ reader

    def _ensure_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(
                self._run(), name="kvrelay-pubsub-reader"
            )

    def _has_live(self) -> bool:
        return any(ch.mailboxes for ch in self._channels.values())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        lost_at: float | None = None  # None until this run has been connected once
        backoff = 0.05
        while not self._closed:
            try:
                transport = await self._factory()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if lost_at is None:
                    self._fail_all(
                        BrokerUnavailable,
                        f"cannot connect to Redis at {self._where} (pub/sub): {exc}",
                    )
                    return
                if loop.time() - lost_at >= self._reconnect_timeout:
                    self._fail_all(
                        BrokerUnavailable,
                        f"lost the connection to Redis at {self._where} and could not "
                        f"reconnect within {self._reconnect_timeout:g}s: {exc}",
                    )
                    return
                await asyncio.sleep(backoff)
                # Capped low: a failover's new primary answers within a second or two.
                backoff = min(backoff * 2, 0.5)
                continue
            backoff = 0.05
            self.connects += 1
            self._attach(transport)
            refused: RespError | None = None
            try:
                await self._read_loop(transport)
            except RespError as exc:
                refused = exc
            except Exception as exc:
                log.warning("pub/sub connection to %s lost (%s); reconnecting", self._where, exc)
            finally:
                if self._transport is transport:
                    self._detach()
                await transport.aclose()
            if refused is not None:
                self._fail_all(
                    BrokerUnavailable, f"Redis at {self._where} refused a pub/sub command: {refused}"
                )
                return
            if self._closed or not self._has_live():
                return
            lost_at = loop.time()

    def _attach(self, transport: Transport) -> None:
        self._transport = transport
        for name, ch in list(self._channels.items()):
            if ch.mailboxes:
                self._dirty.add(name)
            elif not ch.sent and not ch.expected:
                del self._channels[name]
        self._flush_scheduled = False
        self._schedule_flush()

    def _detach(self) -> None:
        """Forget the server side of every subscription; keep what streams want."""
        self._transport = None
        loop = asyncio.get_running_loop()
        for name, ch in list(self._channels.items()):
            ch.sent = False
            ch.expected.clear()
            if not ch.mailboxes:
                del self._channels[name]
                continue
            if ch.ready is None or ch.ready.done():
                # Live stream: wait for the new confirmation, then re-read the log.
                ch.ready = loop.create_future()
                ch.ready.add_done_callback(_retrieve)
                ch.resync = True

    async def _read_loop(self, transport: Transport) -> None:
        pinged = False
        handle = self._handle
        while not self._closed:
            frames = await transport.read(self._health_interval)
            if frames is None:
                if pinged:
                    raise TransportLost(f"no reply to PING within {self._health_interval:g}s")
                await transport.ping()
                pinged = True
                continue
            pinged = False
            if frames:
                handle(frames)
                # A full socket buffer returns without suspending: let streams run.
                await asyncio.sleep(0)

    def _handle(self, frames: list[Frame]) -> None:
        channels = self._channels
        jobs = self._jobs
        for kind, name, data in frames:
            if kind == b"message":
                self.messages += 1
                if not isinstance(data, bytes):
                    continue
                try:
                    pairs = unpack_message(data)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    self.unreadable += 1
                    if self.unreadable <= 3:
                        log.warning("dropping an unreadable message on %r (%d bytes)",
                                    name, len(data))
                    continue
                for job_id, events in pairs:
                    for mailbox in jobs.get(job_id, ()):
                        mailbox.put(events)
            elif kind == b"subscribe":
                ch = channels.get(name)
                if ch is None:
                    continue
                if ch.expected:
                    future = ch.expected.popleft()
                    if future is not None and not future.done():
                        future.set_result(None)
                if ch.resync and not ch.expected:
                    ch.resync = False
                    for mailbox in ch.mailboxes:
                        mailbox.put(RESYNC)
            elif kind == b"unsubscribe":
                ch = channels.get(name)
                if ch is None:
                    continue
                if ch.expected:
                    ch.expected.popleft()
                if not ch.mailboxes and not ch.sent and not ch.expected:
                    del channels[name]

    def _fail_all(self, error_class: type[KvrelayError], message: str) -> None:
        """Fail every stream and pending subscription (a fresh exception for each)."""
        for ch in self._channels.values():
            for mailbox in ch.mailboxes:
                mailbox.fail(error_class(message))
            if ch.ready is not None and not ch.ready.done():
                ch.ready.set_exception(error_class(message))
        self._channels.clear()
        self._jobs.clear()
        self._dirty.clear()
