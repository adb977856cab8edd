"""A stream's reads of a job's log and record are judged by the server that answered.

``CLIENT PAUSE WRITE`` on a watched primary makes the sentinels promote its replica; the
old primary wakes up still a primary, for many seconds, with every connection it had. A
worker's append held there completes on it (judged in doubt and sent again, so the new
primary gets its own copy, or a new run's events under those seqs), and an SDK
connection left idle on it reads that log: events the job's real log never holds.
Chaos seed 10022: a token shown twice (the new run wrote it again one seq later), a
gap, a chunk the final log lacks. The reads now end with the primary's ``WAIT``; the
old primary has no replica, so the sentinels are asked, name another server, and the
read is made again there.

Real processes: a primary, its replica and three sentinels; the SDK's own command client
(``sentinel_connect.sentinel_redis``) and ``ReplicaWait``, as ``AsyncClient`` builds them.
"""

from __future__ import annotations

import uuid

import pytest
import redis
from helpers.sentinel_cluster import SentinelCluster

from kvrelay import event_log
from kvrelay.event_frames import pack_events
from kvrelay.judged_read import judged_run, reread_in_doubt
from kvrelay.keys import Keyspace
from kvrelay.protocol import Finished, Tokens, decode_event, encode_event
from kvrelay.replica_wait import ReplicaWait
from kvrelay.sentinel_connect import sentinel_redis
from kvrelay.sentinel_url import parse_sentinel_url
from kvrelay.write_carrier import pool_primary

pytestmark = [pytest.mark.integration, pytest.mark.slow]
KEYS = Keyspace()
PAUSE_MS = 25_000


@pytest.fixture
def cluster(own_sentinels: SentinelCluster) -> SentinelCluster:
    return own_sentinels


def _tokens(seq: int) -> bytes:
    return pack_events([encode_event(Tokens(seq=seq, index=0, token_ids=[seq], text="t"))])


def _replaced(cluster: SentinelCluster) -> int:
    """Pause the primary's writes until the sentinels name another; unpause it (it is
    still a primary then); the old primary's port."""
    old = cluster.primary_port()
    with redis.Redis(host="127.0.0.1", port=old) as primary:
        primary.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        cluster.wait_replaced(old)
        primary.execute_command("CLIENT", "UNPAUSE")
    return old


async def test_a_log_read_the_replaced_primary_answers_is_made_again(
        cluster: SentinelCluster) -> None:
    target = parse_sentinel_url(f"{cluster.url}?wait_timeout_ms=200")
    sdk = sentinel_redis(target, max_connections=2, connect_timeout=10.0)
    plain = sentinel_redis(target, max_connections=2, connect_timeout=10.0)
    replica_wait = ReplicaWait(target.wait_replicas, target.wait_timeout_ms)

    async def judged(pipe: object) -> list[object]:
        return await judged_run(replica_wait, pipe)

    job = f"job-{uuid.uuid4().hex[:8]}"
    log_key, record = KEYS.event_log(job), KEYS.job_record(job)
    try:
        with redis.Redis(host="127.0.0.1", port=cluster.primary_port()) as primary:
            for seq in range(3):
                event_log.add_entry(primary, log_key, seq, _tokens(seq), run="w1#a")
            primary.hset(record, "state", "running")
            assert primary.execute_command("WAIT", 1, 5000) == 1
        for client in (sdk, plain):  # each pool's connection, idle on the first primary
            assert (await client.xlen(log_key)) == 3
        old = _replaced(cluster)
        with redis.Redis(host="127.0.0.1", port=old) as zombie:
            # The first run's held appends and its end, completed on the old primary.
            for seq in range(3, 6):
                event_log.add_entry(zombie, log_key, seq, _tokens(seq), run="w1#a")
            zombie.hset(record, "state", "done")
            assert zombie.info("replication")["role"] == "master"
        with redis.Redis(host="127.0.0.1", port=cluster.primary_port()) as primary:
            # The new run's events, on the new primary: seq 3 is its end.
            finished = pack_events([encode_event(Finished(seq=3, finish_reason="length"))])
            event_log.add_entry(primary, log_key, 3, finished, terminal=True, run="w2#b")

        # The hazard is real: an unjudged read on the idle connection sees the old
        # primary's log.
        unjudged, _ = await event_log.read_some_after(plain, KEYS, job, -1, page=256)
        assert [decode_event(bytes(e)).seq for e in unjudged] == [0, 1, 2, 3, 4, 5]
        assert pool_primary(sdk.connection_pool) == ("127.0.0.1", old)

        async def read() -> list[object]:
            found, _more = await event_log.read_some_after(sdk, KEYS, job, -1, page=256,
                                                           run=judged)
            return [decode_event(bytes(raw)) for raw in found]

        events = await reread_in_doubt(read, within=30.0)
        assert [type(e).__name__ for e in events] == ["Tokens"] * 3 + ["Finished"], events
        assert pool_primary(sdk.connection_pool) == ("127.0.0.1", cluster.primary_port())
    finally:
        await sdk.aclose()
        await plain.aclose()


async def test_a_read_the_demoted_primary_answers_as_a_replica_is_made_again(
        cluster: SentinelCluster) -> None:
    """Once the old primary is demoted, a connection still open to it (the sentinels
    close clients' connections as they demote it, but one opened from a view a moment
    old, or one whose close was lost, stays) reaches a replica, which refuses the read's
    ``WAIT``: not an error for the stream (chaos seed 10022, "WAIT cannot be used with
    replica instances"), a read made again on the primary."""
    target = parse_sentinel_url(f"{cluster.url}?wait_timeout_ms=200")
    sdk = sentinel_redis(target, max_connections=2, connect_timeout=10.0)
    replica_wait = ReplicaWait(target.wait_replicas, target.wait_timeout_ms)
    job = f"job-{uuid.uuid4().hex[:8]}"
    log_key = KEYS.event_log(job)
    try:
        with redis.Redis(host="127.0.0.1", port=cluster.primary_port()) as primary:
            for seq in range(3):
                event_log.add_entry(primary, log_key, seq, _tokens(seq), run="w1#a")
            assert primary.execute_command("WAIT", 1, 5000) == 1
        assert (await sdk.xlen(log_key)) == 3  # a connection, idle on the first primary
        old = _replaced(cluster)
        with redis.Redis(host="127.0.0.1", port=old) as demoted:
            # Demoted as the sentinels will, its clients' connections left open.
            demoted.execute_command("REPLICAOF", "127.0.0.1", cluster.primary_port())
            assert demoted.info("replication")["role"] == "slave"
        assert pool_primary(sdk.connection_pool) == ("127.0.0.1", old)

        async def read() -> list[int]:
            found, _more = await event_log.read_some_after(
                sdk, KEYS, job, -1, page=256,
                run=lambda pipe: judged_run(replica_wait, pipe))
            return [decode_event(bytes(raw)).seq for raw in found]

        assert await reread_in_doubt(read, within=30.0) == [0, 1, 2]
        assert pool_primary(sdk.connection_pool) == ("127.0.0.1", cluster.primary_port())
    finally:
        await sdk.aclose()
