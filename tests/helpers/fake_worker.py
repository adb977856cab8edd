"""A scripted stand-in for a worker's side of the event contract (no engine, no Celery).

It writes events as a real worker may: each event as its own log entry through
``kvrelay.event_log.add_entry`` (the log's one format), THEN publishes it packed
(``kvrelay.event_frames``) on the reply channel of the client that sent the job (the
request's ``reply_to``, remembered from every request this module sees) and on the job's
own channel (where watchers listen; a real worker publishes there only while the job
has watchers). Knobs let a test skip the publish of some events (log only), publish out
of order, or publish duplicates, to exercise the client's ordering and gap-filling.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import redis as sync_redis

from kvrelay import event_log
from kvrelay.event_frames import pack_events, pack_message, pack_pair
from kvrelay.keys import Keyspace
from kvrelay.protocol import (
    TERMINAL_EVENTS,
    AnyEvent,
    Failed,
    Finished,
    GenerateRequest,
    Started,
    Timings,
    Tokens,
    Usage,
    WorkerInfo,
    decode_request_json,
    encode_event,
    encode_worker_info,
)

KEYS = Keyspace()  # the default namespace
# The reply channel of every job whose request this module has seen.
REPLY_TO: dict[str, str] = {}


def remember(request: GenerateRequest) -> None:
    """Note where ``request``'s events are published (its client's reply channel)."""
    if request.reply_to:
        REPLY_TO[request.job_id] = request.reply_to


def channels_of(job_id: str) -> list[str]:
    """Where the events of ``job_id`` are published: its client's channel and its own."""
    reply = REPLY_TO.get(job_id)
    return [reply, KEYS.events_channel(job_id)] if reply else [KEYS.events_channel(job_id)]


def message(job_id: str, *events: bytes) -> bytes:
    """A pub/sub message carrying ``events`` (encoded) of ``job_id``."""
    return pack_message([pack_pair(job_id, pack_events(list(events)))])


def completion_events(
    texts: Sequence[str] | Sequence[Sequence[str]],
    *,
    worker: str = "fake-worker-1",
    finish_reason: str = "stop",
    prompt_tokens: int = 3,
    token_base: int = 100,
) -> list[AnyEvent]:
    """Started, one Tokens per text delta (per choice when given a list per choice), Finished.

    Token ids are ``token_base + position`` (plus ``1000 * choice``), so tests can check them.
    """
    per_choice: list[Sequence[str]]
    if texts and not isinstance(texts[0], str):
        per_choice = [list(t) for t in texts]  # type: ignore[arg-type]
    else:
        per_choice = [list(texts)]  # type: ignore[arg-type]
    events: list[AnyEvent] = [Started(seq=0, worker=worker, prompt_tokens=prompt_tokens)]
    seq = 1
    longest = max((len(c) for c in per_choice), default=0)
    for pos in range(longest):
        for index, choice in enumerate(per_choice):
            if pos < len(choice):
                events.append(
                    Tokens(
                        seq=seq,
                        index=index,
                        token_ids=[token_base + 1000 * index + pos],
                        text=choice[pos],
                    )
                )
                seq += 1
    completion_tokens = sum(len(c) for c in per_choice)
    events.append(
        Finished(
            seq=seq,
            finish_reason=finish_reason,
            finish_reasons=[finish_reason] * len(per_choice),
            usage=Usage(
                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cached_tokens=1
            ),
            timings=Timings(queue=0.001, ttft=0.002, decode=0.003, total=0.006),
        )
    )
    return events


def failed_event(seq: int, code: str, message: str = "boom") -> Failed:
    return Failed(seq=seq, code=code, message=message)


def _add(client: Any, job_id: str, event: AnyEvent, data: bytes) -> Any:
    terminal = isinstance(event, TERMINAL_EVENTS)
    return event_log.add_entry(client, KEYS.event_log(job_id), event.seq, pack_events([data]),
                               terminal=terminal)


async def emit(
    redis: Any, job_id: str, event: AnyEvent, *, log: bool = True, publish: bool = True
) -> None:
    """Log then publish one event (the order the contract requires)."""
    data = encode_event(event)
    if log:
        await _add(redis, job_id, event, data)
    if publish:
        for channel in channels_of(job_id):
            await redis.publish(channel, message(job_id, data))


async def claim(redis: Any, job_id: str) -> None:
    """Record the job as running, as a worker's claim does before its first event (so
    ``resume`` knows the job)."""
    await redis.hset(KEYS.job_record(job_id), "state", "running")


async def play(
    redis: Any,
    job_id: str,
    events: Iterable[AnyEvent],
    *,
    delay: float = 0.0,
    skip_publish: Iterable[int] = (),
    publish_order: Sequence[int] | None = None,
    duplicate: Iterable[int] = (),
) -> None:
    """Emit ``events``: log all in order; publish in ``publish_order`` (seqs) if given."""
    events = list(events)
    skipped = set(skip_publish)
    doubled = set(duplicate)
    if publish_order is None:
        for event in events:
            await emit(redis, job_id, event, publish=event.seq not in skipped)
            if event.seq in doubled:
                await emit(redis, job_id, event, log=False)
            if delay:
                await asyncio.sleep(delay)
        return
    by_seq = {e.seq: e for e in events}
    for event in events:
        await emit(redis, job_id, event, publish=False)
    for seq in publish_order:
        await emit(redis, job_id, by_seq[seq], log=False)
        if delay:
            await asyncio.sleep(delay)


def play_sync(
    redis: sync_redis.Redis, job_id: str, events: Iterable[AnyEvent], *, delay: float = 0.0
) -> None:
    """``play`` for a worker running in a thread (log + publish in one pipeline per event)."""
    for event in events:
        data = encode_event(event)
        pipe = redis.pipeline(transaction=False)
        _add(pipe, job_id, event, data)
        for channel in channels_of(job_id):
            pipe.publish(channel, message(job_id, data))
        pipe.execute()
        if delay:
            time.sleep(delay)


async def announce(
    redis: Any, worker_id: str, model: str, *, ttl_ms: int = 5000, **fields: Any
) -> WorkerInfo:
    """Register a worker as a real one does: heartbeat first, then SADD."""
    info = WorkerInfo(
        worker_id=worker_id,
        model=model,
        host="test-host",
        pid=1234,
        updated_at=time.time(),
        **fields,
    )
    await redis.set(KEYS.worker_heartbeat(worker_id), encode_worker_info(info), px=ttl_ms)
    await redis.sadd(KEYS.workers, worker_id)
    return info


async def wait_until(predicate: Callable[[], Awaitable[Any]], within: float = 3.0) -> None:
    """Poll an async predicate until it is truthy (TimeoutError after ``within`` s)."""
    async with asyncio.timeout(within):
        while not await predicate():  # noqa: ASYNC110 - polling Redis state, no event to wait on
            await asyncio.sleep(0.01)


def decode_celery_message(raw: bytes | str) -> tuple[dict[str, Any], GenerateRequest]:
    """A Celery message as kombu's Redis transport stores it -> (headers, request)."""
    message = json.loads(raw)
    assert message["content-type"] == "application/json", message["content-type"]
    body = message["body"]
    if message["properties"].get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, _kwargs, _embed = json.loads(body)
    return message["headers"], decode_request_json(json.dumps(args[0]))


async def serve_queue(
    redis: Any,
    model: str,
    script: Callable[[GenerateRequest], list[AnyEvent]] | None = None,
    *,
    delay: float = 0.0,
    seen: list[GenerateRequest] | None = None,
    concurrency: int = 32,
) -> None:
    """Consume ``KEYS.queue(model)`` like a worker (BRPOP) and play ``script`` per job.

    Runs until cancelled; each job is played in its own task, at most ``concurrency`` at
    once (as a worker runs so many): 200 at once on one client outran its pool's 100
    connections, and a play that met ``MaxConnectionsError`` died, its stream waiting.
    """
    jobs: set[asyncio.Task[None]] = set()
    slots = asyncio.Semaphore(concurrency)

    async def run(job_id: str, events: list[AnyEvent]) -> None:
        async with slots:
            await play(redis, job_id, events, delay=delay)

    try:
        while True:
            item = await redis.brpop([KEYS.queue(model)], timeout=1)
            if item is None:
                continue
            _headers, request = decode_celery_message(item[1])
            remember(request)
            if seen is not None:
                seen.append(request)
            events = script(request) if script else completion_events(["Hel", "lo"])
            task = asyncio.create_task(run(request.job_id, events))
            jobs.add(task)
            task.add_done_callback(jobs.discard)
    finally:
        for task in jobs:
            task.cancel()


class ThreadWorker:
    """``serve_queue`` in a thread with a sync client (for the sync ``Client``)."""

    def __init__(
        self, url: str, model: str, *, texts: Sequence[str] = ("Hel", "lo"), delay: float = 0.0
    ) -> None:
        self.url = url
        self.model = model
        self.texts = list(texts)
        self.delay = delay
        self.requests: list[GenerateRequest] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = sync_redis.Redis.from_url(self.url)
        try:
            while not self._stop.is_set():
                item = client.brpop([KEYS.queue(self.model)], timeout=0.1)
                if item is None:
                    continue
                _headers, request = decode_celery_message(item[1])
                remember(request)
                self.requests.append(request)
                for event in completion_events(self.texts):
                    if client.get(KEYS.abort_flag(request.job_id)):
                        break
                    play_sync(client, request.job_id, [event], delay=self.delay)
        finally:
            client.close()

    def __enter__(self) -> ThreadWorker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
