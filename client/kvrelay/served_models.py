"""Which models have a live worker, for the precheck: a failover never makes one unknown.

Workers announce themselves in the registry (``kvrelay.workers``) with a heartbeat that
expires unless refreshed. After a Sentinel failover the new primary holds the registry
as it was replicated, and a heartbeat that expired during the outage is missing from it
until the worker, reconnected, writes its next one there: read then, a live worker's
model looks unserved, and calls made during the failover were refused as "unknown
model" (the gateway's 404) while the worker was alive.

So once the registry was out of reach (a read failed in a way that may pass) or came
from another primary than the read before, and for up to the client's
``reconnect_timeout`` after that, the precheck answers from the registry it read before
(a model served then is taken as served still) and waits for a model it did not see then
to be announced. The failover is over, as far as the registry goes, once every model
served before is back in a read made ``SETTLE_S`` after it was last noticed (by then a
heartbeat written before the outage has expired unless its worker wrote it again); from
then on, and whenever nothing went wrong, a model no live worker serves is refused at
once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

from kvrelay.errors import UnknownModel
from kvrelay.write_carrier import Address

__all__ = ["FRESH_S", "ServedModels"]

# How long the answer "which models have live workers" is reused.
FRESH_S: Final = 1.0
# A model missing from an answer older than this is looked up again before refusing.
RECHECK_S: Final = 0.1
# During a failover: how often a model missing from the registry is looked up again.
POLL_S: Final = 0.25
# A read this long after a failover was last noticed shows only heartbeats written again
# since: longer than a heartbeat lives (``max(3, 3 x KVRELAY_LEASE_REFRESH)`` s, 3 s by
# default).
SETTLE_S: Final = 5.0


class ServedModels:
    """The models live workers serve, as the registry said lately: one read serves
    concurrent callers, and the answer is reused for as long as a caller accepts.

    ``read`` reads the registry (it calls ``update``, and ``unreachable`` on each failed
    try); ``patience``: how long after the registry was last disturbed the models served
    before still count, and how long a call waits for its model.
    """

    def __init__(self, read: Callable[[], Awaitable[frozenset[str]]], *,
                 patience: float) -> None:
        self._read = read
        self.patience = patience
        self._models: frozenset[str] | None = None
        self._read_at = 0.0
        self._reading: asyncio.Task[frozenset[str]] | None = None
        # The primary the latest read came from (None: unknown, or not behind sentinels).
        self._primary: Address | None = None
        # When a failover was last noticed (None: none is going on) and the models served
        # before it (None: no read recent enough before it).
        self._disturbed_at: float | None = None
        self._before: frozenset[str] | None = None

    def update(self, models: frozenset[str], primary: Address | None = None) -> None:
        """A registry read's answer, from ``primary``."""
        now = asyncio.get_running_loop().time()
        if primary is not None and self._primary is not None and primary != self._primary:
            self._disturbed(now)
        if primary is not None:
            self._primary = primary
        if (self._disturbed_at is not None and now - self._disturbed_at >= SETTLE_S
                and self._before is not None and self._before <= models):
            self._disturbed_at = self._before = None  # every model served before is back
        self._models = models
        self._read_at = now

    def unreachable(self) -> None:
        """A registry read failed in a way that may pass (Redis out of reach, failing
        over): until the registry settles, a missing model may only be late."""
        self._disturbed(asyncio.get_running_loop().time())

    def _disturbed(self, now: float) -> None:
        if not self._failing_over(now):
            recent = self._models is not None and now - self._read_at <= self.patience
            self._before = self._models if recent else None
        self._disturbed_at = now

    def _failing_over(self, now: float) -> bool:
        return self._disturbed_at is not None and now - self._disturbed_at < self.patience

    async def get(self, max_age: float) -> frozenset[str]:
        """The served models, read again when the latest answer is older than ``max_age``."""
        loop = asyncio.get_running_loop()
        if self._models is not None and loop.time() - self._read_at < max_age:
            return self._models
        if self._reading is None or self._reading.done():
            self._reading = loop.create_task(self._read_once())
        return await asyncio.shield(self._reading)

    async def _read_once(self) -> frozenset[str]:
        return await self._read()

    async def require(self, model: str) -> None:
        """Return once ``model`` is served (or, during a failover, was just before it);
        raise ``UnknownModel`` when it is not, at once unless a failover is going on, and
        at the latest ``patience`` seconds from now."""
        served = await self.get(FRESH_S)
        if model in served:
            return
        served = await self.get(RECHECK_S)
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.patience
        while model not in served:
            now = loop.time()
            if not self._failing_over(now) or now >= give_up_at:
                listing = ", ".join(sorted(served)) if served else "none"
                raise UnknownModel(
                    f"no live worker serves model {model!r} (models served: {listing}); "
                    "pass require_worker=False to enqueue ahead of the workers")
            if self._before is not None and model in self._before:
                return  # served just before the failover: its worker is only late
            await asyncio.sleep(POLL_S)
            served = await self.get(POLL_S)
