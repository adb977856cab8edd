"""How many jobs wait for each model: read from Redis when a scraper asks, at a bounded cost.

A job waits in one of three places: its model's shared queue (``Keyspace.queue``), the
own queue of one of the model's workers (prefix-aware placement,
``Keyspace.worker_queue``; a dead worker's counts until live workers move it), or inside
a live worker's engine, taken but not yet running (``stats["waiting"]`` of its heartbeat,
at most a second old). The first two are Redis lists, the third the workers' word.

Which models: those live workers serve, those the caller names, and those whose shared
queue exists with nobody serving it (the case an operator most needs to see: a queue
growing after its last worker died). The last are found by ``SCAN``, at most
``scan_calls`` calls of ``scan_count`` keys per read, its cursor carried from one read to
the next, so a read costs the same however large the keyspace: a queue appears within a
few reads. One read is then two pipelined round trips (queue lists and worker-queue sets,
then the worker queues' lengths) plus the registry read, whatever the number of models.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from redis.asyncio import Redis

from kvrelay.keys import Keyspace
from kvrelay.workers import live_workers

__all__ = ["ModelQueue", "QueueDepthReader"]

# kombu names a queue's priority lists ``<queue>\x06\x16<priority>``; kvrelay sends no
# priorities, and those lists are not models.
_PRIORITY_SEP = "\x06\x16"
# Queues found by scanning are remembered, up to this many (a bound on a read's cost).
MAX_FOUND = 1000


@dataclass(frozen=True)
class ModelQueue:
    """The jobs waiting for one model, where they wait, and who serves it."""

    namespace: str
    model: str
    # Jobs in Redis lists: the shared queue and the model's workers' own queues.
    queued: int
    # Jobs inside live workers' engines, waiting to run (their heartbeats' ``waiting``).
    engine_waiting: int
    # Live workers serving the model.
    workers: int

    @property
    def depth(self) -> int:
        """Every job waiting for the model, wherever it waits."""
        return self.queued + self.engine_waiting


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class QueueDepthReader:
    """Reads ``ModelQueue``s of one namespace; keeps the scan's cursor between reads."""

    def __init__(self, redis: Redis, keys: Keyspace, *, scan_calls: int = 4,
                 scan_count: int = 500) -> None:
        self.redis = redis
        self.keys = keys
        self.scan_calls = scan_calls
        self.scan_count = scan_count
        self._cursor = 0
        self._found: set[str] = set()

    async def read(self, models: Iterable[str] = ()) -> list[ModelQueue]:
        """Every model served, named in ``models`` or found queued, sorted by name."""
        workers = await live_workers(self.redis, self.keys, prune=False)
        await self._scan()
        named = set(models)
        served = {worker.model for worker in workers}
        names = sorted(named | served | self._found)
        if not names:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for model in names:
            pipe.llen(self.keys.queue(model))
            pipe.zrange(self.keys.worker_queues(model), 0, -1)
        replies = await pipe.execute()
        shared = [int(n) for n in replies[0::2]]
        own = [[_text(worker_id) for worker_id in ids] for ids in replies[1::2]]
        pipe = self.redis.pipeline(transaction=False)
        for model, ids in zip(names, own, strict=True):
            for worker_id in ids:
                pipe.llen(self.keys.worker_queue(model, worker_id))
        lengths = iter([int(n) for n in await pipe.execute()] if any(own) else [])
        result = []
        for model, queued, ids in zip(names, shared, own, strict=True):
            queued += sum(next(lengths) for _ in ids)
            mine = [worker for worker in workers if worker.model == model]
            result.append(ModelQueue(
                namespace=self.keys.namespace, model=model, queued=queued,
                engine_waiting=sum(_count(worker.stats.get("waiting")) for worker in mine),
                workers=len(mine)))
            if queued == 0 and model not in served and model not in named:
                self._found.discard(model)  # its list is gone: a new one is found again
        return result

    async def _scan(self) -> None:
        """Up to ``scan_calls`` steps of the keyspace scan for models' shared queues."""
        head = self.keys.queue("")
        for _ in range(self.scan_calls):
            self._cursor, names = await self.redis.scan(self._cursor, match=f"{head}*",
                                                        count=self.scan_count)
            for name in map(_text, names):
                model = name[len(head):]
                if model and _PRIORITY_SEP not in model and len(self._found) < MAX_FOUND:
                    self._found.add(model)
            if self._cursor == 0:
                return


def _count(value: object) -> int:
    """A heartbeat's count, or 0 if it is missing or not a number (a newer worker's)."""
    try:
        return max(0, int(value))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0
