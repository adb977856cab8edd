"""A wire tap: every event any worker publishes, with the time it was seen.

The SDK hides what the checker must see (it drops seqs it already has and never shows a
``Started``), so the tap subscribes to every client's reply channel (every event of a job
goes to the channel of the client that started it) and keeps each event as published: two different events under one seq, an event after a job's end, or
a run that starts after its cancel show here. Pub/sub drops what is sent while the tap
reconnects (a failover), so the checker treats what the tap lacks as unknown, never as
a violation; once subscribed again, the tap reads the logs of the jobs it saw running, so
an end it missed is still kept.

Behind sentinels the tap leaves a primary they replaced, as the SDK's reader does
(``kvrelay.primary_watch``): a primary replaced while paused stays one for many seconds
and hears none of what workers publish on the new one, and its logs hold writes that
vanish. So every ``PRIMARY_CHECK_S`` the tap asks the sentinels, reconnects when they
name another server, and reads a log only after asking them (an idle connection to the
old primary is dropped then).

Logs expire ``KVRELAY_LOG_TTL`` after their job ends, sooner than a slow caller may be
done, so the tap also reads a job's log as soon as it sees the job's terminal event
(``logs``): the store as it was when the job ended.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import msgspec
import redis
from helpers.worker_process import redis_for

from chaos.log_read import LogRead, read_log
from kvrelay.event_frames import unpack_events, unpack_message
from kvrelay.keys import Keyspace
from kvrelay.protocol import TERMINAL_EVENTS, AnyEvent, decode_event

KEYS = Keyspace()
# How often the tap asks the sentinels which primary they name.
PRIMARY_CHECK_S = 0.5


@dataclass(frozen=True)
class Tapped:
    at: float  # time.time() when the tap read it
    event: AnyEvent
    raw: bytes


class WireTap:
    def __init__(self, url: str) -> None:
        self.url = url
        self.events: dict[str, list[Tapped]] = defaultdict(list)
        # Each ended job's log (with the run that wrote each event), read when its
        # terminal event went by.
        self.logs: dict[str, LogRead] = {}
        self.reconnects = 0
        # Messages on a reply channel that did not decode (what and why): each one is a
        # violation, since a caller could not have read it either.
        self.undecodable: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-tap", daemon=True)

    def start(self, timeout: float = 10.0) -> WireTap:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the wire tap never subscribed")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def of(self, job_id: str) -> list[Tapped]:
        with self._lock:
            return list(self.events.get(job_id, ()))

    def _run(self) -> None:
        while not self._stop.is_set():
            client: redis.Redis | None = None
            try:
                client = redis_for(self.url)
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.psubscribe(KEYS.reply_channel("*"))
                self._catch_up(client)
                self._ready.set()
                next_check = time.monotonic() + PRIMARY_CHECK_S
                while not self._stop.is_set():
                    if time.monotonic() >= next_check:
                        _leave_a_replaced_primary(client, pubsub)
                        next_check = time.monotonic() + PRIMARY_CHECK_S
                    message = pubsub.get_message(timeout=0.2)
                    if message is not None:
                        for job_id in self._record(time.time(), message["data"]):
                            self._read_log(client, job_id)
            except (redis.RedisError, OSError):
                self.reconnects += 1
                time.sleep(0.2)
            finally:
                if client is not None:
                    with contextlib.suppress(Exception):
                        client.close()

    def _record(self, at: float, data: bytes) -> list[str]:
        """Keep the message's events; the jobs it ends (seen for the first time)."""
        try:
            decoded = [(job_id, [(bytes(raw), decode_event(bytes(raw)))
                                 for raw in unpack_events(events)])
                       for job_id, events in unpack_message(data)]
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
            with self._lock:
                self.undecodable.append(f"{type(exc).__name__}: {exc}; "
                                        f"{bytes(data)[:80]!r}")
            return []
        ended = []
        with self._lock:
            for job_id, pairs in decoded:
                for blob, event in pairs:
                    self.events[job_id].append(Tapped(at, event, blob))
                    if isinstance(event, TERMINAL_EVENTS) and job_id not in self.logs:
                        self.logs[job_id] = LogRead()
                        ended.append(job_id)
        return ended

    def _catch_up(self, client: redis.Redis) -> None:
        """Once subscribed again after a lost connection: the logs of the jobs seen
        running, read now, so a terminal event published while the tap was away is not
        missed for good (an orphan job's log is the only record of its end, and it
        expires ``KVRELAY_LOG_TTL`` later)."""
        with self._lock:
            running = [job_id for job_id in self.events if job_id not in self.logs]
        _follow_the_sentinels(client)
        for job_id in running:
            log = read_log(client, job_id)
            if log.ended:
                with self._lock:
                    self.logs.setdefault(job_id, log)

    def _read_log(self, client: redis.Redis, job_id: str) -> None:
        """The ended job's log, given up to a second to show its terminal event."""
        give_up = time.monotonic() + 1.0
        while True:
            _follow_the_sentinels(client)
            log = read_log(client, job_id)
            with self._lock:
                self.logs[job_id] = log
            if log.ended or time.monotonic() > give_up:
                return
            time.sleep(0.1)


def _follow_the_sentinels(client: redis.Redis) -> None:
    """Ask the sentinels for the primary (a Sentinel-managed pool drops its idle
    connections to another one then); nothing for a plain client."""
    pool = client.connection_pool
    if hasattr(pool, "get_master_address"):
        pool.get_master_address()


def _leave_a_replaced_primary(client: redis.Redis, pubsub: Any) -> None:
    """Raise ``redis.ConnectionError`` (the tap reconnects and catches up) when the
    sentinels name a primary other than the one the pub/sub connection is on."""
    pool = client.connection_pool
    connection = pubsub.connection
    if not hasattr(pool, "get_master_address") or connection is None:
        return
    try:
        named = pool.get_master_address()
    except redis.RedisError:  # no sentinel answered: no evidence the primary moved
        return
    if (str(named[0]), int(named[1])) != (str(connection.host), int(connection.port)):
        raise redis.ConnectionError(f"the sentinels name {named[0]}:{named[1]} as the "
                                    f"primary, not {connection.host}:{connection.port}")
