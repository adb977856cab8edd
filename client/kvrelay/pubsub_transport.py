"""The subscriber connection as the dispatcher drives it, behind one small interface.

A ``Transport`` lives for one connection attempt: reconnecting, resubscribing and
re-reading the logs are the dispatcher's job (``kvrelay.dispatcher``). The fast one is
``kvrelay.resp.RespConnection``; ``RedisPyTransport`` serves injected redis-py clients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import redis.exceptions
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from kvrelay.connection import REDIS_ERRORS
from kvrelay.resp import Frame, RespError, TransportLost

__all__ = ["RedisPyTransport", "Transport", "TransportFactory"]


class Transport(Protocol):
    """A subscriber connection as the dispatcher needs it (one per connection attempt)."""

    async def subscribe(self, channels: Sequence[bytes]) -> None: ...

    async def unsubscribe(self, channels: Sequence[bytes]) -> None: ...

    async def ping(self) -> None: ...

    async def read(self, idle: float) -> list[Frame] | None:
        """Frames received (maybe none), or None after ``idle`` s without any data."""
        ...

    async def aclose(self) -> None: ...


TransportFactory = Callable[[], Awaitable[Transport]]


class RedisPyTransport:
    """A ``Transport`` over redis-py's ``PubSub`` (used for injected clients, e.g. fakeredis).

    Slower per message than ``RespConnection`` but works with any redis-py compatible
    client. redis-py may silently reconnect inside a call; that is reported as a lost
    connection so the dispatcher resubscribes and re-reads the logs itself.
    """

    def __init__(self, pubsub: PubSub) -> None:
        self._pubsub = pubsub
        self._reconnected = False

    @classmethod
    async def open(cls, client: Redis) -> RedisPyTransport:
        pubsub = client.pubsub()
        await pubsub.connect()
        transport = cls(pubsub)
        conn = pubsub.connection
        if conn is not None:
            conn.register_connect_callback(transport._on_connect)
        return transport

    async def _on_connect(self, _connection: object) -> None:
        self._reconnected = True

    async def _command(self, *args: bytes | str) -> None:
        try:
            await self._pubsub.execute_command(*args)
        except REDIS_ERRORS as exc:
            raise TransportLost(str(exc)) from exc

    async def subscribe(self, channels: Sequence[bytes]) -> None:
        await self._command("SUBSCRIBE", *channels)

    async def unsubscribe(self, channels: Sequence[bytes]) -> None:
        await self._command("UNSUBSCRIBE", *channels)

    async def ping(self) -> None:
        await self._command("PING")

    @staticmethod
    def _frame(message: dict[str, object]) -> Frame:
        kind = str(message["type"]).encode()
        channel = message.get("channel")
        if isinstance(channel, str):
            channel = channel.encode()
        data = message.get("data")
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, int)):
            data = b""
        return (kind, channel if isinstance(channel, bytes) else b"", data)

    async def read(self, idle: float) -> list[Frame] | None:
        if self._reconnected:
            raise TransportLost("the pub/sub connection was re-established underneath us")
        try:
            message = await self._pubsub.get_message(timeout=idle)
            if message is None:
                return None
            frames = [self._frame(message)]
            for _ in range(255):
                message = await self._pubsub.get_message(timeout=0)
                if message is None:
                    break
                frames.append(self._frame(message))
        except REDIS_ERRORS as exc:
            raise TransportLost(str(exc)) from exc
        except redis.exceptions.ResponseError as exc:
            raise RespError(str(exc)) from exc
        return frames

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._pubsub.aclose()

