"""The fault injectors: each takes a planned fault, does it to the real processes, waits
its duration, undoes it, and records when it really began and ended (the checker widens
its time bounds by the faults that overlap them).

Every step is bounded; a fault that could not be done is recorded with its error (a
harness problem, reported apart from checker violations).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chaos import redis_ops
from chaos.cluster import ChaosCluster
from chaos.schedule import (
    DROP_LOG_ENTRY,
    FAILBACK,
    MISCONF,
    NOREPLICAS,
    PAUSE_WRITES,
    PRIMARY_KILL,
    PROCESS_FAULTS,
    PUBSUB_KILL,
    REDIS_FAULTS,
    REDIS_LATENCY,
    REDIS_RESTART,
    REPLICA_LAG,
    WORKER_BLACKHOLE,
    WORKER_CUT,
    WORKER_KILL,
    WORKER_STOP,
    FaultPlan,
)
from kvrelay.keys import Keyspace

if TYPE_CHECKING:
    from chaos.workload import Workload

KEYS = Keyspace()


@dataclass
class FaultRecord:
    plan: FaultPlan
    began: float = 0.0  # time.time()
    ended: float = 0.0
    note: str = ""
    error: str = ""


class FaultInjector:
    """Runs a schedule's faults against ``cluster`` at their planned offsets from ``t0``.

    ``running_jobs`` names the jobs whose streams are live now (the log-tampering defect
    picks its victim among them); ``workload``'s callers are the other half of a
    ``cancel_race``."""

    def __init__(self, cluster: ChaosCluster, running_jobs: Callable[[], list[str]],
                 workload: Workload | None = None) -> None:
        self.cluster = cluster
        self.running_jobs = running_jobs
        self.workload = workload
        self.records: list[FaultRecord] = []

    async def run_all(self, faults: tuple[FaultPlan, ...], t0: float) -> None:
        # Redis faults take turns: undoing one must not meet another half done (a fault
        # that waits its turn starts late, and its record says when it really began).
        redis_turn = asyncio.Lock()
        await asyncio.gather(*(self._run_at(f, t0, redis_turn) for f in faults))

    async def _run_at(self, fault: FaultPlan, t0: float, redis_turn: asyncio.Lock) -> None:
        await asyncio.sleep(max(0.0, t0 + fault.at - time.time()))
        if fault.kind in REDIS_FAULTS:
            async with redis_turn:
                await self._run(fault)
        else:
            await self._run(fault)

    async def _run(self, fault: FaultPlan) -> None:
        record = FaultRecord(fault, began=time.time())
        self.records.append(record)
        try:
            record.note = await asyncio.to_thread(self._do, fault)
        except Exception as exc:  # reported as a harness error, never swallowed
            record.error = f"{type(exc).__name__}: {exc}"
        record.ended = time.time()

    def _do(self, fault: FaultPlan) -> str:
        cluster = self.cluster
        if fault.kind in (WORKER_KILL, WORKER_STOP):
            slot = cluster.slots[fault.target]
            name = slot.current.name
            if fault.kind == WORKER_KILL:
                slot.kill()
                time.sleep(fault.duration)
                return f"killed {name}, started {slot.start().name}"
            slot.stop()
            time.sleep(fault.duration)
            slot.cont()
            return f"stopped {name}"
        if fault.kind == NOREPLICAS:
            assert cluster.replicated is not None
            cluster.replicated.stop_replica()
            time.sleep(fault.duration)
            cluster.replicated.resume_replica()
            cluster.replicated.wait_writable()
            return "replica stopped"
        if fault.kind == MISCONF:
            assert cluster.replicated is not None
            cluster.replicated.misconf()
            time.sleep(fault.duration)
            cluster.replicated.heal_misconf()
            return "snapshots failed"
        if fault.kind == PAUSE_WRITES:
            cluster.pause_writes(fault.duration)
            time.sleep(fault.duration)
            return "writes paused"
        if fault.kind in (WORKER_CUT, WORKER_BLACKHOLE, REDIS_LATENCY):
            return self._through_proxy(fault)
        if fault.kind in (PRIMARY_KILL, FAILBACK, REPLICA_LAG):
            return self._sentinel_fault(fault)
        if fault.kind == REDIS_RESTART:
            assert cluster.replicated is not None
            return redis_ops.restart_primary(cluster.replicated, cluster.spawn, fault.duration)
        if fault.kind == PUBSUB_KILL:
            with cluster.admin() as client:
                killed = client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            time.sleep(fault.duration)
            return f"killed {killed} pub/sub connections"
        if fault.kind in PROCESS_FAULTS:
            from chaos.process_faults import apply_process_fault

            assert self.workload is not None
            return apply_process_fault(cluster, self.workload, fault)
        if fault.kind == DROP_LOG_ENTRY:
            return self._drop_log_entry(fault.duration)
        raise ValueError(f"unknown fault {fault.kind}")

    def _through_proxy(self, fault: FaultPlan) -> str:
        """The proxy faults: one worker cut off or blackholed (its engine computes on),
        or every chunk to and from Redis slowed; undone after ``duration`` whatever
        happened meanwhile."""
        cluster = self.cluster
        if fault.kind == REDIS_LATENCY:
            assert cluster.proxies is not None
            cluster.proxies.set_latency(fault.magnitude)
            try:
                time.sleep(fault.duration)
            finally:
                cluster.proxies.set_latency(0.0)
            return f"{fault.magnitude * 1000:.0f} ms per chunk"
        group = cluster.groups[fault.target]
        name = cluster.slots[fault.target].current.name
        if fault.kind == WORKER_CUT:
            group.cut()
            try:
                time.sleep(fault.duration)
            finally:
                group.heal_cut()
            return f"cut {name} off"
        group.blackhole()
        try:
            time.sleep(fault.duration)
        finally:
            group.heal_blackhole()
        return f"blackholed {name}"

    def _sentinel_fault(self, fault: FaultPlan) -> str:
        sentinel = self.cluster.sentinel
        assert sentinel is not None
        spawn = self.cluster.spawn
        if fault.kind == PRIMARY_KILL:
            return redis_ops.kill_primary(sentinel, spawn, fault.duration)
        if fault.kind == FAILBACK:
            return redis_ops.failback(sentinel, spawn, fault.duration)
        return redis_ops.replica_lag(redis_ops.current_replica(sentinel), fault.magnitude,
                                     fault.duration)

    def _drop_log_entry(self, within: float) -> str:
        """Delete one entry (not the last) from the log of a job still streaming: what a
        write lost on the way to Redis would leave."""
        deadline = time.monotonic() + max(within, 5.0)
        with self.cluster.admin() as client:
            while time.monotonic() < deadline:
                for job_id in self.running_jobs():
                    entries = client.xrange(KEYS.event_log(job_id))
                    if len(entries) >= 2:
                        victim = entries[-2][0]
                        client.xdel(KEYS.event_log(job_id), victim)
                        return f"deleted entry {victim.decode()} of job {job_id}"
                time.sleep(0.05)
        raise TimeoutError("no running job had a log entry to delete")
