"""Behind sentinels, the pub/sub connection leaves a primary the sentinels replaced.

A primary demoted by a failover it survived (it paused, or was cut off from the
sentinels) keeps its connections and answers on them until the sentinels reconfigure
it, many seconds later. A subscriber still connected to it hears nothing the workers now
publish on the new primary, and a stream that ends meanwhile would wait for an event
that never comes. So the reader asks the sentinels every ``CHECK_EVERY_S`` which primary
they name; when it is another, the connection is dropped like a lost one: the dispatcher
reconnects to the new primary, subscribes again and reads each stream's gap from its log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from kvrelay.resp import Endpoint, Frame, RespConnection, TransportLost

__all__ = ["CHECK_EVERY_S", "PrimaryWatchedTransport"]

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0


class PrimaryWatchedTransport:
    """A pub/sub connection to ``endpoint`` that is lost once ``named()`` (the primary the
    sentinels name now) is another server."""

    def __init__(self, inner: RespConnection, endpoint: Endpoint,
                 named: Callable[[], Awaitable[Endpoint]], *,
                 every: float = CHECK_EVERY_S) -> None:
        self._inner = inner
        self._endpoint = endpoint
        self._named = named
        self._every = every
        self._next_check = asyncio.get_running_loop().time() + every

    async def subscribe(self, channels: Sequence[bytes]) -> None:
        await self._inner.subscribe(channels)

    async def unsubscribe(self, channels: Sequence[bytes]) -> None:
        await self._inner.unsubscribe(channels)

    async def ping(self) -> None:
        await self._inner.ping()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def read(self, idle: float) -> list[Frame] | None:
        """As ``RespConnection.read``, asking the sentinels every ``every`` s meanwhile."""
        loop = asyncio.get_running_loop()
        quiet_until = loop.time() + idle
        while True:
            now = loop.time()
            if now >= self._next_check:
                await self._check()
                self._next_check = loop.time() + self._every
            left = quiet_until - now
            if left <= 0:
                return None
            frames = await self._inner.read(min(left, self._next_check - now))
            if frames is not None:
                return frames

    async def _check(self) -> None:
        try:
            named = await self._named()
        except Exception as exc:  # no sentinel answered: no evidence the primary moved
            log.debug("could not ask the sentinels for the primary: %s", exc)
            return
        if (named.host, named.port) != (self._endpoint.host, self._endpoint.port):
            raise TransportLost(
                f"the sentinels name {named.host}:{named.port} as the primary, not "
                f"{self._endpoint.host}:{self._endpoint.port}")
