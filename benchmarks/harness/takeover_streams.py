"""The takeover benchmark's runs (``benchmarks/takeover.py``): its prompts, every stream's
chunks as its caller saw them, the ``Started`` events on the side, the kill of the
busiest worker, and its jobs followed through their records until each is claimed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# How often the victim's job records and the heartbeats are read around the kill.
POLL_S = 0.05
HEARTBEAT_POLL_S = 0.5
# The engine figures each heartbeat sample keeps.
HEARTBEAT_STATS = ("running", "waiting", "steps", "prefill_waits", "preemptions", "kv_usage",
                   "prefix_cache_hits", "prefill_tokens_per_s")

SUBJECTS = ("a lighthouse keeper", "a retired astronaut", "a young baker", "a lost robot",
            "a river pilot", "a chess prodigy", "a beekeeper", "a night-shift nurse",
            "a cartographer", "a violin maker")
SETTINGS = ("on a frozen island", "in a desert city", "aboard a night train",
            "in a mountain village", "under the sea", "in a harbour town",
            "on a distant planet")


def prompts(count: int) -> list[list[dict[str, str]]]:
    """``count`` chat prompts with distinct user turns (they share only the template)."""
    if count > len(SUBJECTS) * len(SETTINGS):
        raise SystemExit(f"at most {len(SUBJECTS) * len(SETTINGS)} distinct prompts")
    pairs = [(s, p) for p in SETTINGS for s in SUBJECTS][:count]
    return [[{"role": "user", "content": f"Write a long, detailed story about {who} {where}. "
              f"Describe every day of their life."}] for who, where in pairs]


# ----------------------------------------------------------------------- recording


@dataclass
class StreamRecord:
    """What one stream's caller saw: each chunk's arrival (wall clock), seq and tokens."""

    index: int
    job_id: str = ""
    times: list[float] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    worker: str | None = None
    error: str | None = None
    done: bool = False

    def gaps(self) -> list[tuple[float, float]]:
        """(gap seconds, time the gap ended) between consecutive chunks."""
        return [(b - a, b) for a, b in zip(self.times, self.times[1:], strict=False)]

    def longest_pause(self, after: float = float("-inf")) -> float:
        return max((g for g, end in self.gaps() if end > after), default=0.0)


@dataclass
class StartedSeen:
    at: float
    attempt: int
    worker: str
    prompt_tokens: int


class StartedListener:
    """A second subscriber on the client's reply channel: when each ``Started`` arrived
    (the SDK folds them into the stream without handing them to the caller)."""

    def __init__(self, url: str, channel: str) -> None:
        import redis.asyncio

        self.redis = redis.asyncio.Redis.from_url(url)
        self.channel = channel
        self.started: dict[str, list[StartedSeen]] = {}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> StartedListener:
        self.pubsub = self.redis.pubsub()
        await self.pubsub.subscribe(self.channel)
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.pubsub.aclose()
        await self.redis.aclose()

    async def _read(self) -> None:
        from kvrelay.event_frames import unpack_events, unpack_message
        from kvrelay.protocol import Started, decode_event

        while True:
            message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is None:
                continue
            now = time.time()
            for job_id, events in unpack_message(message["data"]):
                for raw in unpack_events(events):
                    event = decode_event(bytes(raw))
                    if isinstance(event, Started):
                        self.started.setdefault(job_id, []).append(StartedSeen(
                            now, event.attempt, event.worker, event.prompt_tokens))


@dataclass
class KillPlan:
    """When and whom to kill, and what to watch once it is done."""

    kill_at: int
    pids: dict[str, int]  # worker name (host:pid) -> pid, only the workers started here
    running_key: str
    lease_ttl: float
    record_key: Any  # job id -> its record's key (``Keyspace.job_record``)
    victim: str = ""
    killed_at: float = 0.0
    median_tokens_at_kill: int = 0
    streams_per_worker: dict[str, int] = field(default_factory=dict)
    # job id -> lease expiry of the dead run, when its record first said ``queued``
    # (requeued), when a new run claimed it, and which worker (host:pid) that was
    expiry: dict[str, float] = field(default_factory=dict)
    requeued: dict[str, float] = field(default_factory=dict)
    claimed: dict[str, float] = field(default_factory=dict)
    claimed_by: dict[str, str] = field(default_factory=dict)


async def kill_when_due(plan: KillPlan, records: list[StreamRecord], redis: Any,
                        deadline: float) -> None:
    """SIGKILL the busiest worker once the median stream has ``kill_at`` tokens, then
    follow its jobs' records until each is claimed by a new run."""
    while time.time() < deadline:
        counts = sorted(len(r.tokens) for r in records)
        if counts[len(counts) // 2] >= plan.kill_at:
            break
        await asyncio.sleep(POLL_S)
    else:
        return
    by_worker = Counter(r.worker for r in records if r.worker and not r.done)
    plan.victim = by_worker.most_common(1)[0][0]
    if plan.victim not in plan.pids:  # never signal a process this run did not start
        raise RuntimeError(f"the busiest worker {plan.victim} is not one started here")
    os.kill(plan.pids[plan.victim], signal.SIGKILL)
    plan.killed_at = time.time()
    plan.median_tokens_at_kill = counts[len(counts) // 2]
    plan.streams_per_worker = dict(by_worker)
    victims = [r.job_id for r in records if r.worker == plan.victim and not r.done]
    scores = dict(await redis.zrange(plan.running_key, 0, -1, withscores=True))
    plan.expiry = {j.decode(): s / 1000 for j, s in scores.items() if j.decode() in victims}
    dead_runs = dict(zip(victims, await _records(redis, plan, victims), strict=True))
    while time.time() < deadline and len(plan.claimed) < len(plan.expiry):
        await asyncio.sleep(POLL_S)
        now = time.time()
        waiting = [j for j in plan.expiry if j not in plan.claimed]
        for job_id, (state, run, owner) in zip(waiting, await _records(redis, plan, waiting),
                                               strict=True):
            if state == "queued":
                plan.requeued.setdefault(job_id, now)
            elif state == "running" and run != dead_runs[job_id][1]:
                # The claim scored the job's running entry at its time + the lease.
                score = await redis.zscore(plan.running_key, job_id)
                plan.claimed[job_id] = min(now, score / 1000 - plan.lease_ttl) if score else now
                plan.claimed_by[job_id] = ":".join(owner.split(":")[:2])


async def _records(redis: Any, plan: KillPlan, job_ids: list[str]
                   ) -> list[tuple[str, str, str]]:
    """(state, run, owner) of each job's record, in one round trip."""
    pipe = redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(plan.record_key(job_id), "state", "run", "owner")
    return [tuple((v or b"").decode() for v in fields) for fields in await pipe.execute()]


async def watch_heartbeats(client: Any, samples: list[dict[str, Any]]) -> None:
    """Each new heartbeat of each worker: jobs held and the engine's queue and counters."""
    seen: set[tuple[int, float]] = set()
    while True:
        with contextlib.suppress(Exception):
            for info in await client.workers():
                if (info.pid, info.updated_at) not in seen:
                    seen.add((info.pid, info.updated_at))
                    samples.append({"at": info.updated_at, "pid": info.pid,
                                    "jobs_running": info.jobs_running,
                                    **{k: info.stats.get(k) for k in HEARTBEAT_STATS}})
        await asyncio.sleep(HEARTBEAT_POLL_S)


async def one_stream(client: Any, record: StreamRecord, messages: list[dict[str, str]],
                     tokens: int, salt: str) -> None:
    from kvrelay import KvrelayError

    try:
        async with client.stream(messages=messages, max_tokens=tokens, temperature=0.0,
                                 ignore_eos=True, cache_salt=salt) as stream:
            record.job_id = stream.job_id
            async for chunk in stream:
                record.times.append(time.time())
                record.seqs.append(chunk.seq)
                record.sizes.append(len(chunk.token_ids))
                record.tokens.extend(chunk.token_ids)
                record.worker = stream.worker
            record.worker = stream.worker
            record.done = True
    except KvrelayError as exc:
        record.error = f"{type(exc).__name__}: {exc}"


async def run_streams(url: str, served: str, chats: list[list[dict[str, str]]], tokens: int,
                      run_limit: float, kill: KillPlan | None
                      ) -> tuple[list[StreamRecord], dict[str, list[StartedSeen]], float,
                                 list[dict[str, Any]]]:
    """All streams at once; with ``kill``, the kill and the lease watch beside them."""
    import redis.asyncio

    from kvrelay import AsyncClient

    records = [StreamRecord(i) for i in range(len(chats))]
    heartbeats: list[dict[str, Any]] = []
    salt = f"takeover-bench-{uuid.uuid4().hex}"
    async with AsyncClient(url, model=served, stream_timeout=min(run_limit, 300),
                           placement=False) as client, \
            StartedListener(url, client.reply_channel) as listener:
        admin = redis.asyncio.Redis.from_url(url)
        beats = asyncio.create_task(watch_heartbeats(client, heartbeats))
        await asyncio.wait_for(asyncio.gather(*(  # the workers' first steps, untimed
            client.generate(messages=chat, max_tokens=4, ignore_eos=True,
                            cache_salt=f"warm-up-{salt}")
            for chat in chats[:8])), timeout=run_limit)
        start = time.time()
        deadline = start + run_limit
        tasks = [asyncio.create_task(one_stream(client, r, chat, tokens, salt))
                 for r, chat in zip(records, chats, strict=True)]
        killer = (asyncio.create_task(kill_when_due(kill, records, admin, deadline))
                  if kill is not None else None)
        _, late = await asyncio.wait(tasks, timeout=run_limit)
        for task in late:
            task.cancel()
        for record, task in zip(records, tasks, strict=True):
            if task in late:
                record.error = f"not finished within {run_limit:g}s"
        if killer is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(killer, timeout=max(1.0, deadline - time.time()))
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats
        await admin.aclose()
        await asyncio.sleep(0.5)  # the listener's last messages
        return records, dict(listener.started), start, heartbeats


