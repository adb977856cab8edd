"""A minimal RESP2 pub/sub connection: the receiving hot path of every stream.

Why not redis-py's ``PubSub``: its per-message overhead (retry wrappers, observability
hooks, a dict per message, one await per frame) adds up when one client carries a
thousand streams at tens of events per second each. This reads whole socket chunks and
parses every complete frame in one synchronous pass. It speaks
only what a subscriber needs: AUTH, CLIENT SETNAME, SUBSCRIBE, UNSUBSCRIBE, PING.
Reconnecting is the dispatcher's job; a connection here lives once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url

__all__ = ["Endpoint", "Frame", "RespConnection", "RespError", "TransportLost", "pack_command"]

# (kind, channel, data): b"message"/b"subscribe"/b"unsubscribe"/b"pong"; data is the
# payload of a message or the subscription count of an ack.
Frame = tuple[bytes, bytes, "bytes | int"]

_READ_SIZE = 1 << 16


class TransportLost(Exception):
    """The pub/sub connection is gone (closed, reset, or silent past the health check)."""


class RespError(Exception):
    """Redis answered with an error reply (``-ERR ...``) where we expected success."""


class _Incomplete(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how to connect, from a ``redis://``, ``rediss://`` or ``unix://`` URL."""

    host: str = "localhost"
    port: int = 6379
    path: str | None = None
    username: str | None = None
    password: str | None = None
    ssl_context: ssl.SSLContext | None = None

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        kw: dict[str, Any] = dict(parse_url(url))
        conn_class = kw.get("connection_class")
        context: ssl.SSLContext | None = None
        if conn_class is not None and issubclass(conn_class, SSLConnection):
            context = ssl.create_default_context(cafile=kw.get("ssl_ca_certs"))
            reqs = str(kw.get("ssl_cert_reqs", "required")).lower()
            if reqs in ("none", "cert_none"):
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if kw.get("ssl_certfile"):
                context.load_cert_chain(kw["ssl_certfile"], kw.get("ssl_keyfile"))
        path = kw.get("path") if conn_class is UnixDomainSocketConnection else None
        return cls(
            host=kw.get("host") or "localhost",
            port=int(kw.get("port") or 6379),
            path=path,
            username=kw.get("username"),
            password=kw.get("password"),
            ssl_context=context,
        )


def _encode_arg(arg: bytes | str | int) -> bytes:
    if isinstance(arg, bytes):
        return arg
    return str(arg).encode()


def pack_command(*args: bytes | str | int) -> bytes:
    """One RESP command: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = _encode_arg(arg)
        parts.append(b"$%d\r\n" % len(data))
        parts.append(data)
        parts.append(b"\r\n")
    return b"".join(parts)


def _parse(buf: bytearray, pos: int) -> tuple[Any, int]:
    """Parse one RESP2 value at ``pos``; raises ``_Incomplete`` if it is not all there."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind = buf[pos]
    if kind == 42:  # '*' array
        count = int(buf[pos + 1 : end])
        pos = end + 2
        if count < 0:
            return None, pos
        items = []
        for _ in range(count):
            item, pos = _parse(buf, pos)
            items.append(item)
        return items, pos
    if kind == 36:  # '$' bulk string
        size = int(buf[pos + 1 : end])
        if size < 0:
            return None, end + 2
        start = end + 2
        stop = start + size
        if len(buf) < stop + 2:
            raise _Incomplete
        return bytes(buf[start:stop]), stop + 2
    if kind == 58:  # ':' integer
        return int(buf[pos + 1 : end]), end + 2
    if kind == 43:  # '+' simple string
        return bytes(buf[pos + 1 : end]), end + 2
    if kind == 45:  # '-' error
        return RespError(bytes(buf[pos + 1 : end]).decode(errors="replace")), end + 2
    raise TransportLost(f"unexpected RESP type byte {kind!r} from Redis")


class RespParser:
    """Incremental parser: feed socket chunks, take every complete value."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        buf = self._buf
        buf += data
        values: list[Any] = []
        pos = 0
        size = len(buf)
        while pos < size:
            try:
                value, pos_next = _parse(buf, pos)
            except _Incomplete:
                break
            values.append(value)
            pos = pos_next
        if pos:
            del buf[:pos]
        return values

    def feed_frames(self, data: bytes) -> list[Frame]:
        """Like ``feed`` but returns pub/sub frames, with a fast path for ``message``."""
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        append = frames.append
        pos = 0
        size = len(buf)
        prefix = _MESSAGE_PREFIX
        skip = len(prefix)
        while pos < size:
            if buf.startswith(prefix, pos):
                # *3 $7 message $<n> <channel> $<m> <data>: two lengths, two slices.
                start = pos + skip
                end = buf.find(b"\r\n", start)
                if end < 0:
                    break
                channel_start = end + 2
                channel_end = channel_start + int(buf[start:end])
                data_head = channel_end + 3  # past "\r\n$"
                end = buf.find(b"\r\n", data_head)
                if end < 0:
                    break
                data_start = end + 2
                data_end = data_start + int(buf[data_head:end])
                if data_end + 2 > size:
                    break
                append(
                    (
                        b"message",
                        bytes(buf[channel_start:channel_end]),
                        bytes(buf[data_start:data_end]),
                    )
                )
                pos = data_end + 2
                continue
            try:
                value, pos_next = _parse(buf, pos)
            except _Incomplete:
                break
            append(_to_frame(value))
            pos = pos_next
        if pos:
            del buf[:pos]
        return frames


_MESSAGE_PREFIX = b"*3\r\n$7\r\nmessage\r\n$"


def _to_frame(value: Any) -> Frame:
    if isinstance(value, list) and len(value) >= 2:
        kind = value[0]
        if kind == b"pong":
            return (b"pong", b"", value[1] if isinstance(value[1], bytes) else b"")
        if len(value) == 3:
            return (kind, value[1], value[2])
    if value == b"PONG":
        return (b"pong", b"", b"")
    if isinstance(value, RespError):
        raise value
    raise TransportLost(f"unexpected reply on the pub/sub connection: {value!r:.200}")


class RespConnection:
    """One subscriber connection. Writes are immediate; ``read`` returns parsed frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._parser = RespParser()
        self._closed = False

    @classmethod
    async def open(
        cls, endpoint: Endpoint, *, connect_timeout: float, client_name: str | None = None
    ) -> RespConnection:
        """Connect, authenticate and name the connection within ``connect_timeout`` s."""
        async with asyncio.timeout(connect_timeout):
            if endpoint.path is not None:
                reader, writer = await asyncio.open_unix_connection(endpoint.path)
            else:
                reader, writer = await asyncio.open_connection(
                    endpoint.host,
                    endpoint.port,
                    ssl=endpoint.ssl_context,
                    server_hostname=endpoint.host if endpoint.ssl_context else None,
                )
            conn = cls(reader, writer)
            try:
                await conn._handshake(endpoint, client_name)
            except BaseException:
                conn.close()
                raise
            return conn

    async def _handshake(self, endpoint: Endpoint, client_name: str | None) -> None:
        replies_expected = 0
        if endpoint.password is not None:
            if endpoint.username:
                self.send(b"AUTH", endpoint.username, endpoint.password)
            else:
                self.send(b"AUTH", endpoint.password)
            replies_expected += 1
        if client_name:
            self.send(b"CLIENT", b"SETNAME", client_name)
            replies_expected += 1
        replies: list[Any] = []
        while len(replies) < replies_expected:
            data = await self._reader.read(_READ_SIZE)
            if not data:
                raise TransportLost("Redis closed the connection during the handshake")
            replies.extend(self._parser.feed(data))
        if endpoint.password is not None and isinstance(replies[0], RespError):
            raise RespError(f"Redis AUTH failed: {replies[0]}")
        # A refused CLIENT SETNAME (ACLs) is harmless: the name is only for operators.

    def send(self, *args: bytes | str | int) -> None:
        if self._closed:
            raise TransportLost("connection closed")
        self._writer.write(pack_command(*args))

    async def subscribe(self, channels: Sequence[bytes]) -> None:
        self.send(b"SUBSCRIBE", *channels)

    async def unsubscribe(self, channels: Sequence[bytes]) -> None:
        self.send(b"UNSUBSCRIBE", *channels)

    async def ping(self) -> None:
        self.send(b"PING")

    async def read(self, idle: float) -> list[Frame] | None:
        """Every complete frame available (possibly none), or None after ``idle`` s quiet."""
        try:
            async with asyncio.timeout(idle):
                data = await self._reader.read(_READ_SIZE)
        except TimeoutError:
            return None
        except OSError as exc:
            raise TransportLost(f"pub/sub connection lost: {exc}") from exc
        if not data:
            raise TransportLost("Redis closed the pub/sub connection")
        return self._parser.feed_frames(data)

    async def aclose(self) -> None:
        self.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self._writer.wait_closed()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._writer.close()
