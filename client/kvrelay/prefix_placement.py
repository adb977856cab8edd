"""Prefix-aware placement: which queue a job goes to, a worker's own or the shared one.

Each worker advertises in its heartbeat the prompt prefixes it served recently (a
``PrefixFilter`` of ``prefix_fingerprints``) and consumes a queue of its own beside the
model's shared queue. A job whose leading fingerprints some worker holds goes to that
worker's queue (the longest leading run wins; the least loaded among equals), so a
conversation's next turn lands where its prefix is cached; anything else, or when that
worker is busy, goes to the shared queue, which every worker consumes.

Busy means any of: draining; its load reaching ``load_cap`` x ``concurrency``; or its
KV cache fuller than ``MAX_KV_USAGE``. And the holder gets the job only while its load is
at most ``MAX_LOAD_LEAD`` above the least loaded candidate's (a placed job waits behind
its worker's load, which the shared queue would have balanced). Its load is this
client's unfinished jobs placed
on it (counted exactly: up when placed, down when the job's stream ends) plus the rest
(its heartbeat's ``jobs_running`` and its own queue's length, less this client's placed
jobs counted at that read, less the jobs of this client that ended on it since). The heartbeats and queue lengths are read at most once per
``refresh_s`` (one registry read and one pipelined round of ``LLEN``), not per job, so
only the exact part moves between reads: a client sending a conversation's turns one
after another never sees its own finished turns as load.

Placement is advisory: a dead worker's queued jobs are moved to the shared queue by the
live workers (``kvrelay_worker.jobs.orphan_queues``), and leases, fencing and failover do not
depend on where a job was queued. It is off unless ``KVRELAY_PLACEMENT=true`` (or
``AsyncClient(placement=True)``): it raises the cache hit rate and throughput, but under
the engine's default settings a hit saves only the turn's history, which does not reliably
shorten the median time to first token; under an inter-token latency target
(``KVRELAY_TARGET_STEP_MS``), where prompt chunks are paced, it does (the placement
benchmark, ``benchmarks/placement.py``, measures both).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Final

from redis.asyncio import Redis

from kvrelay.keys import Keyspace
from kvrelay.prefix_filter import PrefixFilter
from kvrelay.prefix_fingerprints import request_fingerprints
from kvrelay.protocol import GenerateRequest, WorkerInfo
from kvrelay.workers import live_workers

__all__ = ["MAX_KV_USAGE", "MAX_LOAD_LEAD", "PLACEMENT_VARIABLE", "PrefixPlacement", "placement_enabled"]

log = logging.getLogger("kvrelay.prefix_placement")

PLACEMENT_VARIABLE: Final = "KVRELAY_PLACEMENT"
# A worker whose KV cache is fuller than this would have to evict or preempt to take
# another prompt: its jobs go to the shared queue.
MAX_KV_USAGE: Final = 0.95
# How many jobs more than the least loaded worker (of those with a queue of their own)
# the prefix's holder may carry and still get the job. 0 moves conversations off their
# cache too often; no bound at all lets a worker's own conversations queue behind each
# other, which costs more time to first token than the cache saves.
MAX_LOAD_LEAD: Final = 1
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
# Placed jobs remembered until their stream ends; past this many the oldest are forgotten.
_MAX_TRACKED: Final = 100_000


def placement_enabled(flag: bool | None) -> bool:
    """``flag`` when given, else ``$KVRELAY_PLACEMENT`` (off unless 1/true/yes/on)."""
    if flag is not None:
        return flag
    return os.environ.get(PLACEMENT_VARIABLE, "").strip().lower() in _TRUE


@dataclass(slots=True)
class _Candidate:
    """A live worker that consumes its own queue, as last read."""

    worker_id: str
    queue: str  # its own Celery queue's name
    prefixes: PrefixFilter
    capacity: float  # load_cap x concurrency
    others: int  # other clients' jobs running or queued on it, as last read
    kv_usage: float
    draining: bool


class PrefixPlacement:
    """Chooses a job's queue from a cached view of the model's workers."""

    def __init__(self, redis: Redis, keys: Keyspace, *, load_cap: float = 1.0,
                 refresh_s: float = 1.0) -> None:
        if not load_cap > 0:
            raise ValueError(f"load_cap must be positive, got {load_cap}")
        self.redis = redis
        self.keys = keys
        self.load_cap = load_cap
        self.refresh_s = refresh_s
        self._view: dict[str, list[_Candidate]] = {}
        self._read_at = -float("inf")
        self._lock = asyncio.Lock()
        # This client's unfinished placed jobs: which worker each went to, and per worker.
        self._placed: OrderedDict[str, str] = OrderedDict()
        self._inflight: Counter[str] = Counter()

    def job_ended(self, job_id: str, worker: str | None = None) -> None:
        """A job's stream ended, after running on ``worker`` (``host:pid``) if known."""
        worker_id = self._placed.pop(job_id, None)
        if worker_id is not None:
            self._inflight[worker_id] -= 1
            if self._inflight[worker_id] <= 0:
                del self._inflight[worker_id]
            return
        if worker is None:
            return
        # A job that went through the shared queue: the last read may still count it.
        for candidates in self._view.values():
            for candidate in candidates:
                if candidate.worker_id.startswith(worker + ":") and candidate.others > 0:
                    candidate.others -= 1
                    return

    def _load(self, candidate: _Candidate) -> int:
        return candidate.others + self._inflight[candidate.worker_id]

    def _busy(self, candidate: _Candidate) -> bool:
        return (candidate.draining or candidate.kv_usage > MAX_KV_USAGE
                or self._load(candidate) >= candidate.capacity)

    def _note_placed(self, job_id: str, worker_id: str) -> None:
        self._placed[job_id] = worker_id
        self._inflight[worker_id] += 1
        while len(self._placed) > _MAX_TRACKED:  # streams never ended: forget the oldest
            self.job_ended(next(iter(self._placed)))

    async def queue_for(self, request: GenerateRequest) -> str | None:
        """The Celery queue of the worker to place ``request`` on; None: the shared queue."""
        chain = request_fingerprints(request)
        if not chain:
            return None
        candidates = (await self._candidates()).get(request.model, [])
        best: _Candidate | None = None
        best_key = (0, 0)
        for candidate in candidates:
            matched = candidate.prefixes.leading_matches(chain)
            if matched == 0 or self._busy(candidate):
                continue
            key = (matched, -self._load(candidate))
            if key > best_key:
                best, best_key = candidate, key
        if best is None:
            return None
        least = min(self._load(c) for c in candidates if not self._busy(c))
        if self._load(best) > least + MAX_LOAD_LEAD:
            return None  # the shared queue balances better than this hit is worth
        self._note_placed(request.job_id, best.worker_id)
        return best.queue

    async def _candidates(self) -> dict[str, list[_Candidate]]:
        if time.monotonic() - self._read_at < self.refresh_s:
            return self._view
        async with self._lock:  # one read serves every job enqueued meanwhile
            if time.monotonic() - self._read_at >= self.refresh_s:
                self._view = await self._read()
                self._read_at = time.monotonic()
        return self._view

    async def _read(self) -> dict[str, list[_Candidate]]:
        workers = [w for w in await live_workers(self.redis, self.keys) if w.prefix_filter]
        if not workers:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for worker in workers:
            pipe.llen(self.keys.worker_queue(worker.model, worker.worker_id))
        lengths = await pipe.execute()
        view: dict[str, list[_Candidate]] = {}
        for worker, queued in zip(workers, lengths, strict=True):
            view.setdefault(worker.model, []).append(self._candidate(worker, int(queued)))
        return view

    def _candidate(self, worker: WorkerInfo, queued: int) -> _Candidate:
        try:
            kv_usage = float(worker.stats.get("kv_usage", 0.0))
        except (TypeError, ValueError):
            kv_usage = 0.0
        return _Candidate(
            worker_id=worker.worker_id,
            queue=self.keys.celery_worker_queue(worker.model, worker.worker_id),
            prefixes=PrefixFilter.decode(worker.prefix_filter),
            capacity=self.load_cap * max(1, worker.concurrency),
            others=max(0, worker.jobs_running + queued - self._inflight[worker.worker_id]),
            kv_usage=kv_usage,
            draining=worker.draining,
        )
