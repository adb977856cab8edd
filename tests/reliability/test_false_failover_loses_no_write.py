"""A failover the primary survives (it only paused) loses no write the worker counted,
shows no reader an event it then loses, and leaves no subscriber deaf on the old primary.

``CLIENT PAUSE WRITE`` on a watched primary also holds the sentinels' hello ``PUBLISH``,
so their pings go unanswered and they promote the replica. The old primary wakes up
still a primary, with every connection it had, and takes writes until the sentinels
demote it (many seconds later); what it took meanwhile vanishes then. Its ``WAIT``s come
back short (its replica left), and before, a short ``WAIT`` only turned waiting off: the
worker took those writes as done. Now a short ``WAIT`` asks the sentinels, and while one
flags the primary or names another, the write is sent again on a new connection.

Real processes: a primary, its replica, three sentinels, the worker's own job store over
the ``redis+sentinel://`` URL, appending a running job's events with the worker's
``until_written`` while the primary pauses for longer than ``down-after-milliseconds``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
from helpers.sentinel_cluster import SentinelCluster

from kvrelay import event_log
from kvrelay.event_frames import unpack_events, unpack_message
from kvrelay.event_log import AppendResult
from kvrelay.keys import Keyspace
from kvrelay.primary_doubt import PrimaryInDoubt
from kvrelay.primary_watch import PrimaryWatchedTransport
from kvrelay.protocol import Started, Tokens, decode_event
from kvrelay.replica_wait import ReplicaWait
from kvrelay.resp import RespConnection, TransportLost
from kvrelay.sentinel_connect import SentinelEndpoints, sentinel_redis
from kvrelay.sentinel_url import parse_sentinel_url
from kvrelay_worker.jobs.held_writes import until_written
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.redis_client import worker_redis
from kvrelay_worker.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]
KEYS = Keyspace()
JOB = "paused-primary-job"
RUN = "w1#run"
PAUSE_MS = 5000
# Writes go on until this many more are counted after the sentinels name the new primary.
WRITES_AFTER_SWITCH = 20


@pytest.fixture
def cluster(own_sentinels: SentinelCluster) -> SentinelCluster:
    return own_sentinels


def _logged_seqs(cluster: SentinelCluster) -> set[int]:
    """The seqs of the job's log on the primary the sentinels name now (one event per
    entry: ``append_event`` writes each alone, under its own seq's id)."""
    with redis.Redis(host="127.0.0.1", port=cluster.primary_port()) as primary:
        entries = primary.xrange(KEYS.event_log(JOB))
    return {event_log.seq_of_entry_id(entry_id) for entry_id, _ in entries}


def _heard_seqs(listener: Any) -> set[int]:
    """The seqs a pub/sub listener received (then closed)."""
    seqs: set[int] = set()
    while (message := listener.get_message(timeout=0.5)) is not None:
        if message["type"] != "message":
            continue
        for _, events in unpack_message(message["data"]):
            seqs.update(decode_event(bytes(e)).seq for e in unpack_events(events))
    listener.close()
    return seqs


def test_writes_taken_by_a_primary_being_replaced_are_sent_again(
        cluster: SentinelCluster) -> None:
    settings = WorkerSettings(redis_url=f"{cluster.url}?wait_timeout_ms=500", model_name="m",
                              worker_id="w1", lease_ttl=120.0, redis_socket_timeout=10.0)
    client = worker_redis(settings)
    store = JobStore(client, settings)
    assert store.claim(JOB, "{}", "d", RUN).status == "claimed"
    written: list[int] = []
    stop = threading.Event()

    def write() -> None:
        started = Started(seq=0, worker="w1")
        assert until_written(lambda: store.append_event(JOB, started, fenced=RUN), "s") == 0
        written.append(0)
        seq = 1
        while not stop.is_set():
            event = Tokens(seq=seq, token_ids=[seq], text="")
            result = until_written(
                lambda event=event: store.append_event(JOB, event, fenced=RUN), "t")
            assert result in (seq, AppendResult.ALREADY_WRITTEN), result
            written.append(seq)
            seq += 1
            time.sleep(0.02)

    writer = threading.Thread(target=write, daemon=True)
    first_primary = cluster.primary_port()
    # A reader that stays on the first primary: what it hears must all be logged.
    listener = redis.Redis(host="127.0.0.1", port=first_primary).pubsub()
    listener.subscribe(KEYS.events_channel(JOB))
    writer.start()
    try:
        time.sleep(0.5)
        with redis.Redis(host="127.0.0.1", port=first_primary) as primary:
            primary.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        deadline = time.monotonic() + 30
        cluster.wait_replaced(first_primary)
        counted_before_switch = len(written)
        while len(written) < counted_before_switch + WRITES_AFTER_SWITCH:
            assert time.monotonic() < deadline, "the writes never went on after the switch"
            time.sleep(0.1)
    finally:
        stop.set()
        writer.join(timeout=60)
        client.close()
    assert not writer.is_alive()
    with redis.Redis(host="127.0.0.1", port=first_primary) as old:
        # The old primary took writes after the promotion: the case under test happened.
        assert old.info("replication")["role"] == "master"
    heard = _heard_seqs(listener)
    logged = _logged_seqs(cluster)
    missing = sorted(set(written) - logged)
    assert not missing, f"{len(missing)} counted writes are not on the new primary: {missing}"
    assert heard, "the listener heard nothing"
    unlogged = sorted(heard - logged)
    assert not unlogged, f"a reader saw {len(unlogged)} events the new primary lacks: {unlogged}"


async def test_the_sdks_writes_are_sent_again_too(cluster: SentinelCluster) -> None:
    """The SDK's replicated writes (admission, cancels) through the async client and
    ``ReplicaWait.asettle``: every write counted is on the new primary."""
    target = parse_sentinel_url(f"{cluster.url}?wait_timeout_ms=500")
    client = sentinel_redis(target, max_connections=4, connect_timeout=10.0)
    replica_wait = ReplicaWait(target.wait_replicas, target.wait_timeout_ms)
    written: list[int] = []

    async def add(member: int) -> None:
        while True:
            try:
                pipe = client.pipeline(transaction=False)
                pipe.sadd("counted", member)
                wanted = replica_wait.wanted()
                if wanted:
                    pipe.execute_command("WAIT", wanted, replica_wait.timeout_ms)
                replies = await pipe.execute()
                await replica_wait.asettle(replies[-1] if wanted else None,
                                           client.connection_pool)
                return
            except (redis.ConnectionError, redis.TimeoutError):
                await asyncio.sleep(0.05)

    first_primary = cluster.primary_port()
    member = 0
    try:
        for member in range(10):
            await add(member)
            written.append(member)
        with redis.Redis(host="127.0.0.1", port=first_primary) as primary:
            primary.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        deadline = time.monotonic() + 30
        switched_at: float | None = None
        counted_before_switch = 0
        while switched_at is None or len(written) < counted_before_switch + WRITES_AFTER_SWITCH:
            assert time.monotonic() < deadline, "no failover, or no writes after it"
            member += 1
            await add(member)
            written.append(member)
            if switched_at is None and cluster.primary_port() != first_primary:
                switched_at = time.monotonic()
                counted_before_switch = len(written)
            await asyncio.sleep(0.02)
    finally:
        await client.aclose()
    with redis.Redis(host="127.0.0.1", port=cluster.primary_port()) as primary:
        counted = {int(m) for m in primary.smembers("counted")}
    missing = sorted(set(written) - counted)
    assert not missing, f"{len(missing)} counted writes are not on the new primary: {missing}"


async def test_a_subscriber_leaves_the_replaced_primary(cluster: SentinelCluster) -> None:
    """The SDK's pub/sub connection (its own RESP reader, watched as the client builds it
    behind sentinels) is dropped once the sentinels name another primary, though the old
    one still answers on it; before, it stayed there, deaf to the new primary's events."""
    named = SentinelEndpoints(parse_sentinel_url(cluster.url), 5.0)
    try:
        endpoint = await named()
        connection = await RespConnection.open(endpoint, connect_timeout=5.0)
        transport = PrimaryWatchedTransport(connection, endpoint, named, every=0.2)
        await transport.subscribe([b"some-stream"])
        assert await transport.read(0.1) is not None  # the subscribe confirmation
        assert await transport.read(0.5) is None  # quiet, and still the primary
        with redis.Redis(host="127.0.0.1", port=endpoint.port) as primary:
            primary.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        deadline = time.monotonic() + 30
        while cluster.primary_port() == endpoint.port:
            assert time.monotonic() < deadline, "the sentinels never failed over"
            await asyncio.sleep(0.1)
        # Quiet for longer than this, the unwatched connection would just return None.
        with pytest.raises(TransportLost, match="the sentinels name"):
            await transport.read(10.0)
        with redis.Redis(host="127.0.0.1", port=endpoint.port) as old:
            assert old.info("replication")["role"] == "master"  # it still answered
        await transport.aclose()
    finally:
        await named.aclose()


def test_a_reader_never_sees_an_event_a_failover_loses(cluster: SentinelCluster) -> None:
    """A worker that dies at its first refused write (SIGKILL right then): behind
    sentinels its events are published only once a replica holds them, so nothing a
    reader heard is missing from the new primary (where a successor would otherwise write
    another event under the same seq: a duplicated token at the seam)."""
    settings = WorkerSettings(redis_url=f"{cluster.url}?wait_timeout_ms=500", model_name="m",
                              worker_id="w1", lease_ttl=120.0, redis_socket_timeout=10.0)
    client = worker_redis(settings)
    store = JobStore(client, settings)
    assert store.claim(JOB, "{}", "d", RUN).status == "claimed"
    first_primary = cluster.primary_port()
    listener = redis.Redis(host="127.0.0.1", port=first_primary).pubsub()
    listener.subscribe(KEYS.events_channel(JOB))
    stopped_by: list[BaseException] = []

    def write_until_refused() -> None:
        seq = 0
        while True:
            event = (Started(seq=0, worker="w1") if seq == 0
                     else Tokens(seq=seq, token_ids=[seq], text=""))
            try:
                store.append_event(JOB, event, fenced=RUN)
            except redis.ConnectionError as exc:
                stopped_by.append(exc)  # the worker dies here
                return
            seq += 1
            time.sleep(0.02)

    writer = threading.Thread(target=write_until_refused, daemon=True)
    writer.start()
    try:
        time.sleep(0.5)
        with redis.Redis(host="127.0.0.1", port=first_primary) as primary:
            primary.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        writer.join(timeout=60)
        assert not writer.is_alive()
        deadline = time.monotonic() + 30
        while cluster.primary_port() == first_primary:
            assert time.monotonic() < deadline, "the sentinels never failed over"
            time.sleep(0.1)
    finally:
        client.close()
    assert isinstance(stopped_by[0], PrimaryInDoubt), stopped_by
    heard, logged = _heard_seqs(listener), _logged_seqs(cluster)
    assert heard, "the listener heard nothing"
    unlogged = sorted(heard - logged)
    assert not unlogged, f"a reader saw {len(unlogged)} events the new primary lacks: {unlogged}"
