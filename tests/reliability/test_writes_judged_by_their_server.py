"""A short ``WAIT`` is judged by the server that carried the write, and a primary's
degraded mode (writes that stop waiting for a replica) is that primary's alone.

``CLIENT PAUSE WRITE`` on a watched primary also holds the sentinels' hello ``PUBLISH``,
so they promote the replica; the old primary wakes up still a primary and takes what
was held on it, until it is demoted and all of that vanishes. Before, a write that
completed there was judged against the primary its pool named by then (the new one:
"no replica up", so it counted), and the new primary's missing replica turned waiting
off for the whole process, so a push held on the old primary went without a ``WAIT``
and counted too (chaos seed 101: jobs enqueued during the pause never ran).

Real processes: a primary, its replica and three sentinels; kvrelay's own enqueuer
(Celery and kombu's Sentinel transport) and the worker's own job store over the
``redis+sentinel://`` URL.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import pytest
import redis
from helpers.sentinel_cluster import SentinelCluster

from kvrelay import AsyncClient, event_log
from kvrelay.enqueue import CeleryEnqueuer
from kvrelay.keys import Keyspace
from kvrelay.protocol import GenerateRequest, Started
from kvrelay.write_carrier import pool_primary
from kvrelay_worker.jobs.held_writes import until_written
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.redis_client import worker_redis
from kvrelay_worker.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]
KEYS = Keyspace()
MODEL = "held-push-model"
# Long enough for any failover; each test ends the pause itself (CLIENT UNPAUSE).
PAUSE_MS = 25_000


@pytest.fixture
def cluster(own_sentinels: SentinelCluster) -> SentinelCluster:
    return own_sentinels


def _server(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)


def _pause_until_replaced(cluster: SentinelCluster, start_held: threading.Thread | None = None
                          ) -> int:
    """Pause the primary's writes (starting ``start_held`` right after, so its write is
    held there) until the sentinels name another; the old primary's port."""
    first = cluster.primary_port()
    with _server(first) as primary:
        primary.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
    if start_held is not None:
        start_held.start()
    cluster.wait_replaced(first)
    return first


def _unpause(port: int) -> None:
    with _server(port) as server:
        server.execute_command("CLIENT", "UNPAUSE")


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def _queued_jobs(port: int) -> list[str]:
    """The task ids of the messages in the model's queue on the server at ``port``."""
    with _server(port) as server:
        messages = server.lrange(KEYS.queue(MODEL), 0, -1)
    return [json.loads(message)["headers"]["id"] for message in messages]


def _request(job_id: str) -> GenerateRequest:
    return GenerateRequest(job_id=job_id, model=MODEL, prompt="hi")


def _reserve(port: int, job_id: str) -> None:
    """The job's admission record, as the SDK's reservation leaves it, on a replica too."""
    with _server(port) as primary:
        primary.hset(KEYS.job_record(job_id), event_log.DIGEST_FIELD, "digest")
        assert primary.execute_command("WAIT", 1, 5000) == 1


def test_a_push_held_on_the_replaced_primary_reaches_the_new_one(
        cluster: SentinelCluster) -> None:
    """Two enqueuers in one process (two clients; their settings differ, so kombu gives
    them connection pools of their own): the second reaches the new primary first,
    which has no replica yet (the old primary, paused, is not one). Its short
    WAIT degrades that primary only: the first one's push, held on the old primary,
    still waits for a replica there, is judged in doubt, and is pushed again to the new
    primary, once. Before, it went without a WAIT and counted: lost with the old
    primary (the unpause comes right after another unwaited push asked the sentinels,
    within the half second in which no unwaited write asks again)."""
    url = f"{cluster.url}?wait_timeout_ms=500"
    first = CeleryEnqueuer(url, threads=1, connect_timeout=5.0)
    second = CeleryEnqueuer(url, threads=1, connect_timeout=6.0)
    held_job, outcome = f"held-{uuid.uuid4().hex[:8]}", []

    def push_held() -> None:
        try:
            first.publish(_request(held_job))
            outcome.append("enqueued")
        except Exception as exc:  # reported by the assertion below
            outcome.append(repr(exc))

    try:
        first.publish(_request("warm-up"))  # its connection to the first primary
        _reserve(cluster.primary_port(), held_job)
        old = _pause_until_replaced(cluster)
        second.publish(_request("on-new-primary"))  # new primary, no replica: degraded
        pusher = threading.Thread(target=push_held, daemon=True)
        pusher.start()
        time.sleep(1.0)  # its push waits on the paused primary
        assert pusher.is_alive(), outcome
        second.publish(_request("asks-the-sentinels"))  # unwaited: one probe, then none
        _unpause(old)
        pusher.join(timeout=60)
        assert not pusher.is_alive(), "the held push never returned"
        assert outcome == ["enqueued"], outcome
        with _server(old) as server:
            # The old primary was still one when the held push completed on it.
            assert server.info("replication")["role"] == "master"
        new = cluster.primary_port()
        assert new != old
        queued = _queued_jobs(new)
        assert queued.count(held_job) == 1, (
            f"the held job is {queued.count(held_job)} times on the new primary: {queued}")
        assert queued.count("on-new-primary") == 1, queued
    finally:
        for enqueuer in (first, second):
            asyncio.run(enqueuer.aclose())


def test_a_state_write_held_while_the_pool_moved_is_sent_again(
        cluster: SentinelCluster) -> None:
    """The worker's pool is shared by its threads: one's event append is held on the
    paused primary while another opens a connection after the failover, which moves the
    pool to the new primary. The held append, completed on the old primary with a short
    WAIT, was judged against the new one ("no replica up") and counted: lost."""
    settings = WorkerSettings(redis_url=f"{cluster.url}?wait_timeout_ms=500", model_name="m",
                              worker_id="w1", lease_ttl=120.0, redis_socket_timeout=30.0)
    client = worker_redis(settings)
    store = JobStore(client, settings)
    job, run = f"job-{uuid.uuid4().hex[:8]}", "w1#run"
    assert store.claim(job, "{}", "d", run).status == "claimed"
    # Its idle connections closed (as a server's idle timeout would): each one used next
    # connects anew, asking the sentinels for the primary.
    client.connection_pool.disconnect()
    counted: list[object] = []

    def append() -> None:
        started = Started(seq=0, worker="w1")
        counted.append(until_written(lambda: store.append_event(job, started, fenced=run),
                                     "started"))

    writer = threading.Thread(target=append, daemon=True)
    try:
        old = _pause_until_replaced(cluster, start_held=writer)
        # Another of the worker's threads (its heartbeat, its lease keeper) needs a
        # connection now: the pool asks the sentinels and moves to the new primary
        # (tried again, as the worker's calls are, while the sentinels still disagree).
        deadline = time.monotonic() + 30
        while not _answers(client):
            assert time.monotonic() < deadline, "no primary answered after the failover"
            time.sleep(0.1)
        moved_to = pool_primary(client.connection_pool)
        assert moved_to is not None
        assert moved_to[1] != old
        assert writer.is_alive(), "the append was not held on the paused primary"
        _unpause(old)
        writer.join(timeout=60)
        assert not writer.is_alive(), "the held append never returned"
        with _server(old) as server:
            assert server.info("replication")["role"] == "master"
    finally:
        client.close()
    assert counted == [0], counted
    with _server(cluster.primary_port()) as primary:
        logged = [event_log.seq_of_entry_id(entry_id)
                  for entry_id, _ in primary.xrange(KEYS.event_log(job))]
    assert logged == [0], f"a counted append is not on the new primary: {logged}"


async def test_a_reservation_held_while_the_client_moved_is_made_again(
        cluster: SentinelCluster) -> None:
    """The SDK's own writes: its pub/sub reader asks the sentinels every second through
    the command pool, which moves to the new primary while a job's reservation (its
    admission record) is held on the old one. Judged against the new primary, the
    reservation counted and vanished with the old one; now it is made again there, and
    the job is queued there once."""
    job = f"reserved-{uuid.uuid4().hex[:8]}"
    async with AsyncClient(f"{cluster.url}?wait_timeout_ms=500", model=MODEL,
                           require_worker=False) as client:
        warm = client.stream("hi", max_tokens=1)
        await warm.start()  # the command pool and the enqueuer's connection, to the primary
        old = await asyncio.to_thread(cluster.primary_port)
        with _server(old) as primary:
            primary.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        stream = client.stream("hi", max_tokens=1, job_id=job)
        starting = asyncio.create_task(stream.start())
        pool = client._redis.connection_pool
        deadline = time.monotonic() + 30
        while (pool_primary(pool) or ("", old))[1] == old:
            assert time.monotonic() < deadline, "the client never moved to a new primary"
            await asyncio.sleep(0.1)
        assert not starting.done(), "the reservation was not held on the paused primary"
        await asyncio.to_thread(_unpause, old)
        await asyncio.wait_for(starting, 60)
        new = await asyncio.to_thread(cluster.primary_port)
        with _server(new) as primary:
            record = primary.hgetall(KEYS.job_record(job))
        assert record.get(event_log.DIGEST_FIELD.encode()), f"the record was lost: {record}"
        assert _queued_jobs(new).count(job) == 1, _queued_jobs(new)
        await stream.aclose()
        await warm.aclose()


def test_a_push_sent_again_is_queued_once(clean_redis_url: str) -> None:
    """The admission record says the job is on this server's queue already: a push sent
    again (its reply lost, or judged in doubt on a primary that kept it) adds no second
    copy. Before, each push added one."""
    enqueuer = CeleryEnqueuer(clean_redis_url, threads=1)
    job = f"twice-{uuid.uuid4().hex[:8]}"
    with redis.Redis.from_url(clean_redis_url) as server:
        server.hset(KEYS.job_record(job), event_log.DIGEST_FIELD, "digest")
        try:
            enqueuer.publish(_request(job))
            enqueuer.publish(_request(job))
            enqueuer.publish(_request("another"))
        finally:
            asyncio.run(enqueuer.aclose())
        messages = server.lrange(KEYS.queue(MODEL), 0, -1)
    queued = [json.loads(message)["headers"]["id"] for message in messages]
    assert sorted(queued) == ["another", job], queued
