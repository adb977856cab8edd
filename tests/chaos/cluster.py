"""Bring-up of one schedule's processes: a real Redis that can refuse writes or fail
over, and real Celery workers in slots that faults kill, stop and restart.

Redis is a primary with one replica under ``min-replicas-to-write 1`` (refusals:
NOREPLICAS, MISCONF, CLIENT PAUSE WRITE; with an append-only file when the schedule
restarts it), or a primary, a replica and three sentinels (the primary can be killed and
brought back). Workers run with short leases and a short ``KVRELAY_LOG_TTL`` so that
takeovers and the retention check fit in a few seconds.

Each worker reaches Redis through its own proxy group (``chaos.proxy``): one listener
per Redis server and, behind sentinels, one per sentinel, whose replies name the group's
listeners (``chaos.sentinel_view``). The harness itself (callers, tap, checks) talks to
Redis directly.
"""

from __future__ import annotations

import contextlib
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis
from helpers.injected_faults import inject
from helpers.refusing_redis import ReplicatedPrimary
from helpers.sentinel_cluster import MASTER_NAME, SentinelCluster
from helpers.worker_process import WorkerProcess, redis_for

from chaos.proxy import HOST, ProxyGroup, ProxyHub, Route, sentinel_group
from chaos.schedule import (
    PRESSURE,
    REDIS_RESTART,
    SENTINEL,
    VICTIM,
    WORKER_VARIANTS,
    Schedule,
)

# Seconds a job's log lives after its end: the retention check waits this long.
LOG_TTL_S = 4
# KV bytes of one 16-token block of the tiny ``llama-mqa`` model (3 layers, one KV head of
# 64, keys and values, float32).
LLAMA_MQA_BLOCK_BYTES = 3 * 2 * 1 * 64 * 16 * 4
# Worker settings every schedule shares: takeovers within seconds, bounded Redis waits,
# and enough attempts that a few kills of one job's workers are not a lawful failure.
BASE_SETTINGS: dict[str, Any] = {
    "lease_ttl": 2.0, "lease_refresh": 0.5, "watchdog_interval": 0.5, "max_attempts": 10,
    "log_ttl": LOG_TTL_S, "redis_socket_timeout": 5.0, "shutdown_grace": 2.0,
}
# A primary that keeps an append-only file synced every second (what compose.yaml runs):
# a killed process loses no write that Redis wrote to the file before it replied.
AOF_ARGS = ("--appendonly", "yes", "--appendfsync", "everysec")
# Seconds a (re)start of a Redis server may take on the cluster's own thread.
SPAWN_TIMEOUT_S = 60.0


# The engine counters a run reports, summed over every worker it started.
ENGINE_COUNTERS = ("preemptions", "recomputes", "steps")


class WorkerSlot:
    """One place a worker runs; a killed worker is replaced by a new process here."""

    def __init__(self, index: int, url: str, model: str, log_dir: Path, concurrency: int,
                 settings: dict[str, Any], worker_url: str | None = None) -> None:
        self.index = index
        self.url = url
        # What the worker connects to (its proxy); ``url`` is the harness's own way in.
        self.worker_url = worker_url or url
        self.model = model
        self.log_dir = log_dir
        self.concurrency = concurrency
        self.settings = settings
        self.generation = 0
        self.processes: list[WorkerProcess] = []
        self.stopped = False
        # Engine counters of the workers killed here, read from their last heartbeat.
        self.killed_counters: dict[str, int] = {}
        # ``TEST_FAULT_*`` of every process started here (a broken variant).
        self.faults: dict[str, str] = {}

    @property
    def current(self) -> WorkerProcess:
        return self.processes[-1]

    def start(self) -> WorkerProcess:
        name = f"w{self.index}-{self.generation}"
        self.generation += 1
        worker = WorkerProcess(name, self.url, self.model, self.log_dir,
                               concurrency=self.concurrency, **self.settings)
        worker.env["KVRELAY_REDIS_URL"] = self.worker_url
        if self.faults:
            inject(worker, **self.faults)
        self.processes.append(worker.start())
        return worker

    def kill(self) -> None:
        self.cont()
        with contextlib.suppress(Exception):  # counters only: a report, not a check
            stats = self.current.stats()
            for name in ENGINE_COUNTERS:
                self.killed_counters[name] = (self.killed_counters.get(name, 0)
                                              + int(stats.get(name, 0)))
        self.current.kill()

    def stop(self) -> None:
        self.current.signal(signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        if self.stopped:
            self.current.signal(signal.SIGCONT)
            self.stopped = False

    def shutdown(self) -> None:
        self.cont()
        for worker in self.processes:
            worker.stop()


class ChaosCluster:
    """Redis and the workers of one schedule; ``close()`` stops everything it started."""

    def __init__(self, schedule: Schedule, workdir: Path, model_path: str | None = None) -> None:
        self.schedule = schedule
        self.workdir = workdir
        self.sentinel: SentinelCluster | None = None
        self.replicated: ReplicatedPrimary | None = None
        self.model_path = model_path
        self.slots: list[WorkerSlot] = []
        self.proxies: ProxyHub | None = None
        # One per slot: the worker's way to Redis, which worker faults cut or blackhole.
        self.groups: list[ProxyGroup] = []
        # Redis servers are (re)started on this one thread: a server dies with the thread
        # that started it (``PR_SET_PDEATHSIG``), and a fault's thread does not last.
        self.spawner = ThreadPoolExecutor(1, thread_name_prefix="chaos-redis")

    @property
    def url(self) -> str:
        if self.sentinel is not None:
            return self.sentinel.url
        assert self.replicated is not None
        return self.replicated.url

    def start(self, ready_timeout: float = 120.0) -> ChaosCluster:
        try:
            self._start_redis()
            self._start_workers(ready_timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _start_redis(self) -> None:
        if self.schedule.scenario == SENTINEL:
            self.sentinel = SentinelCluster(self.workdir / "ha", down_after_ms=1000)
            self.spawn(self.sentinel.start)
            return
        self.replicated = ReplicatedPrimary(self.workdir / "redis")
        # A replica in sync at once, not after the default 5 s diskless-sync delay.
        primary = self.replicated.primary
        primary.extra_args = (*primary.extra_args, "--repl-diskless-sync-delay", "0")
        if any(f.kind == REDIS_RESTART for f in self.schedule.faults):
            primary.extra_args = (*primary.extra_args, *AOF_ARGS)
        self.spawn(self.replicated.start)

    def spawn(self, start: Any) -> Any:
        """Call ``start`` (a server's start) on the cluster's own thread."""
        return self.spawner.submit(start).result(SPAWN_TIMEOUT_S)

    def _proxy_for(self, index: int) -> tuple[ProxyGroup, str]:
        """Worker ``index``'s proxy group and the URL the worker is given."""
        assert self.proxies is not None
        if self.sentinel is None:
            assert self.replicated is not None
            group = self.proxies.group(f"w{index}", [Route("redis", self.replicated.primary.port)])
            return group, f"redis://{HOST}:{group.port('redis')}/0"
        return sentinel_group(self.proxies, f"w{index}",
                              [self.sentinel.primary.port, self.sentinel.replica.port],
                              self.sentinel.sentinel_ports, MASTER_NAME)

    def _start_workers(self, ready_timeout: float) -> None:
        settings = dict(BASE_SETTINGS)
        settings.update(self.schedule.worker_settings)
        model = self.schedule.model
        if self.schedule.scenario == PRESSURE:
            assert self.model_path is not None, "the pressure scenario needs the tiny model"
            blocks = int(settings.pop("kv_blocks"))
            settings.update(kv_cache_memory=blocks * LLAMA_MQA_BLOCK_BYTES, swap_space_gib=0,
                            model_name=model)
            model = self.model_path
        logs = self.workdir / "workers"
        logs.mkdir(parents=True, exist_ok=True)
        self.proxies = ProxyHub()
        self.slots = []
        for i in range(self.schedule.workers):
            group, worker_url = self._proxy_for(i)
            self.groups.append(group)
            self.slots.append(WorkerSlot(i, self.url, model, logs, self.schedule.concurrency,
                                         settings, worker_url))
        for slot in self.slots:
            if self.schedule.broken in WORKER_VARIANTS:
                slot.faults = {"broken": self.schedule.broken, "victim": VICTIM}
            if slot.index in self.schedule.clock_skew:  # every process of the slot
                slot.faults["clock_skew_s"] = str(self.schedule.clock_skew[slot.index])
            slot.start()
        for slot in self.slots:
            slot.current.wait_ready(ready_timeout)

    def admin_url(self) -> str:
        """A plain URL of the primary as of now."""
        if self.sentinel is not None:
            return f"redis://127.0.0.1:{self.sentinel.primary_port()}/0"
        return self.url

    def admin(self) -> redis.Redis:
        """A client of the primary as of now (after a failover, the new one)."""
        return redis_for(self.url)

    def pause_writes(self, seconds: float) -> None:
        with self.admin() as client:
            client.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "WRITE")

    def worker_logs(self, chars: int = 4000) -> str:
        return "\n".join(f"----- worker {w.name} (pid {w.process.pid if w.process else '-'})"
                         f" -----\n{w.tail(chars)}" for slot in self.slots
                         for w in slot.processes)

    def close(self) -> None:
        for slot in self.slots:
            with contextlib.suppress(Exception):
                slot.shutdown()
        if self.proxies is not None:
            with contextlib.suppress(Exception):
                self.proxies.close()
        if self.replicated is not None:
            with contextlib.suppress(Exception):
                self.replicated.stop()
        if self.sentinel is not None:
            with contextlib.suppress(Exception):
                self.sentinel.stop()
        self.spawner.shutdown(wait=False)


# What a poll may meet while Redis refuses, fails over or restarts: tried again. Any
# other exception is a harness bug and propagates (a swallowed one once hid a broken
# check behind a plain timeout).
POLL_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError)


def wait_until(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate()`` until true or ``timeout`` seconds passed; whether it held.
    Only ``POLL_ERRORS`` count as "not yet"."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(*POLL_ERRORS):
            if predicate():
                return True
        time.sleep(interval)
    return False
