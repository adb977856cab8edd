"""A job message Redis hands to a worker's blocking pop just as the worker's connection
breaks is lost: the job never runs, its caller ends in ``StreamTimeout`` and its record
stays for 24 h (chaos seed 4, a worker cut off from Redis as a job is enqueued).

kombu's consumer takes a message with ``BRPOP``, which removes it from the queue in
Redis, and records it as unacknowledged only once the reply has reached the worker. A
reply lost on the way (a connection reset, a network cut, a worker killed with the reply
in its socket) leaves the message nowhere: not in the queue, not in ``unacked``, not in
the running set that the watch rescans. Real Redis, a real worker behind the chaos
proxy: its blocking pop is caught waiting in Redis, its connection is blackholed (the
pop stays, its reply is held), a job is enqueued (Redis pops it into the held reply),
and the connection is cut (the held reply goes with it). The same loss with a worker
killed while frozen (chaos seed 9200): its pop is answered while it is SIGSTOPped, and it
is SIGKILLed with the reply unread, beside jobs that wait their turn in the queue.

Admission keeps each job's message until the job is claimed; the watch pushes it again
when it waits nowhere a lease after the push (``kvrelay_worker.jobs.fresh_watch``).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from chaos.proxy import HOST, ProxyGroup, ProxyHub, Route
from helpers.redis_server import RedisServer
from helpers.worker_process import WorkerProcess

from kvrelay import Client, Stream
from kvrelay.keys import Keyspace

pytestmark = pytest.mark.integration

KEYS = Keyspace()
MODEL = "simulated"
JOB = {"prompt": "a job whose message is in flight as the connection breaks",
       "max_tokens": 20}
# How long a fix may take to run the job: the dead-delivery watch gives a message back
# within a heartbeat TTL and a watch period (about 4 s here), with room for 2 cores.
RUNS_WITHIN_S = 15.0
# Tries at catching the worker's blocking pop waiting in Redis (kombu's pops time out
# after a second and start again).
TRIES = 20


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    yield redis_server
    redis_server.stop()


def _blocked_pops(direct: redis.Redis) -> int:
    return sum(1 for c in direct.client_list() if c.get("cmd") == "brpop"
               and "b" in c.get("flags", ""))


def _queued(direct: redis.Redis) -> int:
    return sum(int(direct.llen(name)) for name in direct.keys(f"{KEYS.queue(MODEL)}*")
               if direct.type(name) == b"list")


def _popped_into_a_held_reply(client: Client, group: ProxyGroup, direct: redis.Redis,
                              streams: contextlib.ExitStack) -> Stream:
    """Enqueue a job (entering its stream sends it) while the worker's pop waits in
    Redis and its connection holds every byte: Redis pops the message into a reply the
    worker has not read."""
    for _ in range(TRIES):
        deadline = time.monotonic() + 5
        while not _blocked_pops(direct):
            assert time.monotonic() < deadline, "the worker's consumer never waited in BRPOP"
            time.sleep(0.01)
        group.blackhole()
        if _blocked_pops(direct):
            stream = streams.enter_context(client.stream(**JOB))
            time.sleep(0.2)
            if _queued(direct) == 0 and not direct.hvals(KEYS.celery_unacked):
                return stream  # popped, and its reply held in the proxy
            group.heal_blackhole()
            stream.final()  # its pop had timed out first: the job ran normally
            continue
        group.heal_blackhole()
    raise AssertionError(f"no job popped into a held reply in {TRIES} tries")


def test_a_job_popped_as_the_workers_connection_breaks_still_runs(server: RedisServer,
                                                                  tmp_path: Path) -> None:
    hub = ProxyHub()
    group = hub.group("worker", [Route("redis", server.port)])
    worker = WorkerProcess("cutoff", server.url, MODEL, tmp_path, concurrency=4,
                           simulated_step_ms=20, lease_ttl=2.0, lease_refresh=0.5,
                           watchdog_interval=0.5)
    worker.env["KVRELAY_REDIS_URL"] = f"redis://{HOST}:{group.port('redis')}/0"
    direct = redis.Redis(host=HOST, port=server.port)
    worker.start()
    try:
        worker.wait_ready()
        with Client(server.url, model=MODEL, stream_timeout=RUNS_WITHIN_S) as client, \
                contextlib.ExitStack() as streams:
            client.generate(**JOB)  # the worker serves
            stream = _popped_into_a_held_reply(client, group, direct, streams)
            group.cut()  # the held reply, and the message in it, go with the connection
            group.heal_blackhole()
            group.heal_cut()
            final = stream.final()
        assert final.finish_reason == "length"
        assert len(final.token_ids) == JOB["max_tokens"]
        assert worker.alive()
    finally:
        worker.stop()
        hub.close()
        direct.close()


def test_jobs_popped_by_a_frozen_worker_that_is_killed_still_run(server: RedisServer,
                                                                tmp_path: Path) -> None:
    settings = {"concurrency": 4, "simulated_step_ms": 20, "lease_ttl": 2.0,
                "lease_refresh": 0.5, "watchdog_interval": 0.5}
    frozen = WorkerProcess("frozen", server.url, MODEL, tmp_path, **settings)
    direct = redis.Redis(host=HOST, port=server.port)
    frozen.start()
    survivor: WorkerProcess | None = None
    try:
        frozen.wait_ready()
        with Client(server.url, model=MODEL, stream_timeout=RUNS_WITHIN_S) as client, \
                contextlib.ExitStack() as streams:
            client.generate(**JOB)  # it serves
            deadline = time.monotonic() + 5
            while not _blocked_pops(direct):
                assert time.monotonic() < deadline, "the consumer never waited in BRPOP"
                time.sleep(0.01)
            frozen.signal(signal.SIGSTOP)
            opened = [streams.enter_context(client.stream(prompt=f"job {i} beside a frozen "
                                                          "worker", max_tokens=20))
                      for i in range(6)]
            time.sleep(0.2)
            popped = 6 - _queued(direct)
            assert popped == 1, f"{popped} messages left the queue for the frozen worker"
            frozen.kill()
            survivor = WorkerProcess("survivor", server.url, MODEL, tmp_path, **settings)
            survivor.start().wait_ready()
            finals = [stream.final() for stream in opened]
        assert [len(final.token_ids) for final in finals] == [20] * 6
        assert direct.zcard(KEYS.fresh_jobs(MODEL)) == 0
        assert not direct.hlen(KEYS.celery_unacked)
        assert "pushed it again" in survivor.tail(None)
    finally:
        frozen.kill()
        if survivor is not None:
            survivor.stop()
        direct.close()
