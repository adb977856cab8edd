"""What the Redis-side faults do to the servers: a primary killed and brought back as a
replica (a failover, and later a failback), a replica paused in short bursts (replication
lag), a primary with an append-only file killed and restarted from it.

Each step is bounded and raises when it cannot be done or undone, so the fault is
recorded as a harness error. Servers are (re)started through ``spawn``: a server's
process dies with the thread that started it (``PR_SET_PDEATHSIG``), so every start runs
on one thread that lives as long as the cluster.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import redis
from helpers.refusing_redis import ReplicatedPrimary
from helpers.sentinel_cluster import MASTER_NAME, SentinelCluster

from chaos.cluster import wait_until
from kvrelay.cli.redis_server import PrivateRedis
from kvrelay.primary_doubt import DOWN_FLAGS

# How long a failover may take before the fault is recorded as not done.
FAILOVER_TIMEOUT_S = 30.0
# How long a server brought back may take to be a replica in sync that every sentinel
# sees linked.
SETTLE_TIMEOUT_S = 30.0
# After the sentinels see a replica linked, how long before a second failover: writers
# that stopped waiting for a replica while there was none ask the sentinels again every
# 0.5 s and wait again once they see one (``kvrelay.replica_wait``). A failover before
# that may lawfully lose their unwaited writes (docs/sentinel.md), so the harness never
# starts one sooner.
SETTLED_MARGIN_S = 1.5
# Replica lag: each burst of the replica running between two pauses.
LAG_RUN_S = 0.3

Spawn = Callable[[Callable[[], object]], object]


def _sigkill(server: PrivateRedis) -> None:
    process = server.process
    if process is None or process.poll() is not None:
        raise RuntimeError(f"the server on port {server.port} is not running")
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)


def _server_on(sentinel: SentinelCluster, port: int) -> PrivateRedis:
    for server in (sentinel.primary, sentinel.replica):
        if server.port == port:
            return server
    raise RuntimeError(f"no server of the cluster on port {port}")


def _agreed_primary(sentinel: SentinelCluster) -> int | None:
    """The primary's port when every sentinel names the same one, else None."""
    named = set()
    for index in range(len(sentinel.sentinel_ports)):
        with sentinel.sentinel_client(index) as client:
            _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                             MASTER_NAME)
        named.add(int(port))
    return named.pop() if len(named) == 1 else None


def _settled(sentinel: SentinelCluster) -> int | None:
    """The primary, once every sentinel names it and sees the other server up and linked
    to it as its replica, and that server says so itself; else None."""
    primary = _agreed_primary(sentinel)
    if primary is None:
        return None
    replica = next(s.port for s in (sentinel.primary, sentinel.replica) if s.port != primary)
    with redis.Redis(host="127.0.0.1", port=replica, socket_timeout=2) as client:
        info = client.info("replication")
        if info.get("master_link_status") != "up" or int(info.get("master_port", 0)) != primary:
            return None
    for index in range(len(sentinel.sentinel_ports)):
        with sentinel.sentinel_client(index) as client:
            replicas = client.sentinel_slaves(MASTER_NAME)
        if not any(int(r["port"]) == replica and not set(r["flags"].split(",")) & DOWN_FLAGS
                   and r.get("master-link-status") == "ok" and int(r["master-port"]) == primary
                   for r in replicas):
            return None
    return primary


def kill_primary(sentinel: SentinelCluster, spawn: Spawn, down_s: float) -> str:
    """SIGKILL the primary the sentinels name, wait until they all name the promoted
    replica, and after ``down_s`` in all bring the dead server back as its replica; done
    once the cluster settled (the sentinels may still move the primary meanwhile: a dead
    primary back within seconds can win a failover a slower sentinel started)."""
    began = time.monotonic()
    seen: list[int] = []  # the primaries the sentinels agreed on, in turn

    def agreed(unlike: int | None = None) -> bool:
        primary = _agreed_primary(sentinel)
        if primary is None or primary == unlike:
            return False
        seen.append(primary)
        return True

    if not wait_until(agreed, SETTLE_TIMEOUT_S, 0.2):
        raise TimeoutError(f"the sentinels named no one primary {SETTLE_TIMEOUT_S:g}s on")
    old = seen[-1]
    server = _server_on(sentinel, old)
    _sigkill(server)
    if not wait_until(lambda: agreed(unlike=old), FAILOVER_TIMEOUT_S, 0.2):
        raise TimeoutError(f"no new primary {FAILOVER_TIMEOUT_S:g}s after the kill")
    promoted = seen[-1]
    failover_s = time.monotonic() - began
    time.sleep(max(0.0, down_s - failover_s))
    # Back empty (it had no persistence), so unpromotable until it holds the primary's
    # data: a failover that picked it earlier would lose every write, which no Redis
    # deployment restarting a replica from nothing allows (a loaded machine's sentinels
    # once did, with one judging the new primary down mid-sync).
    server.extra_args = ("--replicaof", "127.0.0.1", str(promoted), "--replica-priority", "0")
    spawn(server.start)
    settled: list[int] = []

    def linked() -> bool:
        primary = _settled(sentinel)
        if primary is not None:
            settled.append(primary)
        return primary is not None

    if not wait_until(linked, SETTLE_TIMEOUT_S, 0.2):
        raise TimeoutError(f"{old}, brought back, not a linked replica "
                           f"{SETTLE_TIMEOUT_S:g}s on")
    with redis.Redis(host="127.0.0.1", port=old, socket_timeout=2) as client:
        client.config_set("replica-priority", 100)  # synced: a failover may pick it now
    return (f"primary {old} killed, {promoted} promoted after {failover_s:.1f}s; {old} "
            f"back, settled with {settled[-1]} the primary after "
            f"{time.monotonic() - began:.1f}s")


def failback(sentinel: SentinelCluster, spawn: Spawn, down_s: float) -> str:
    """A second failover once the first settled: wait until a replica is linked and
    every sentinel sees it, then kill the primary again (the replica is the first
    primary, brought back: it is promoted again) and bring the dead one back."""
    if not wait_until(lambda: _settled(sentinel) is not None, SETTLE_TIMEOUT_S, 0.2):
        raise TimeoutError(f"no primary with a linked replica {SETTLE_TIMEOUT_S:g}s on")
    time.sleep(SETTLED_MARGIN_S)
    return "failback: " + kill_primary(sentinel, spawn, down_s)


def replica_lag(server: PrivateRedis, pause_s: float, duration: float) -> str:
    """Pause the replica for ``pause_s`` at a time, ``LAG_RUN_S`` apart, for
    ``duration``: a ``WAIT`` in a pause comes back short, one between them does not, and
    no pause is long enough for a sentinel to call the replica down."""
    process = server.process
    if process is None or process.poll() is not None:
        raise RuntimeError(f"the replica on port {server.port} is not running")
    deadline = time.monotonic() + duration
    pauses = 0
    try:
        while time.monotonic() < deadline:
            os.kill(process.pid, signal.SIGSTOP)
            pauses += 1
            time.sleep(pause_s)
            os.kill(process.pid, signal.SIGCONT)
            time.sleep(LAG_RUN_S)
    finally:
        os.kill(process.pid, signal.SIGCONT)
    return f"replica {server.port} paused {pauses} times for {pause_s:.2f}s"


def current_replica(sentinel: SentinelCluster) -> PrivateRedis:
    primary = sentinel.primary_port()
    return next(s for s in (sentinel.primary, sentinel.replica) if s.port != primary)


def restart_primary(replicated: ReplicatedPrimary, spawn: Spawn, down_s: float) -> str:
    """SIGKILL the primary (it keeps an append-only file: ``cluster.AOF_ARGS``), restart
    it from that file after ``down_s``, and wait until it takes writes again (its
    replica resynced: ``min-replicas-to-write``)."""
    primary = replicated.primary
    with replicated.client() as client:
        before = client.dbsize()
        persistence = client.info("persistence")
        if int(persistence.get("aof_enabled", 0)) != 1:
            raise RuntimeError("the primary keeps no append-only file: a restart loses all")
    _sigkill(primary)
    time.sleep(down_s)
    spawn(primary.start)
    replicated.wait_writable(SETTLE_TIMEOUT_S)
    with replicated.client() as client:
        after = client.dbsize()
    # Writes held back past a stalled fsync (a reply before the write): the only ones a
    # killed process can lose.
    delayed = persistence.get("aof_delayed_fsync", "?")
    return (f"primary restarted from its AOF after {down_s:.1f}s: {before} keys, then "
            f"{after}; aof_delayed_fsync {delayed}")
