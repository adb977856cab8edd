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

from chaos.cluster import ChaosCluster, wait_until
from chaos.schedule import (
    DROP_LOG_ENTRY,
    MISCONF,
    NOREPLICAS,
    PAUSE_WRITES,
    PRIMARY_KILL,
    PROCESS_FAULTS,
    PUBSUB_KILL,
    REDIS_FAULTS,
    WORKER_KILL,
    WORKER_STOP,
    FaultPlan,
)
from kvrelay.keys import Keyspace

if TYPE_CHECKING:
    from chaos.workload import Workload

KEYS = Keyspace()
# How long a failover may take before the fault is recorded as not healed.
FAILOVER_TIMEOUT_S = 30.0


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
        if fault.kind == PRIMARY_KILL:
            return self._kill_primary()
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

    def _kill_primary(self) -> str:
        sentinel = self.cluster.sentinel
        assert sentinel is not None
        old = sentinel.primary_port()
        sentinel.kill_primary()
        if not wait_until(lambda: sentinel.primary_port() != old, FAILOVER_TIMEOUT_S, 0.2):
            raise TimeoutError(f"no new primary {FAILOVER_TIMEOUT_S:g}s after the kill")
        return f"primary {old} killed, now {sentinel.primary_port()}"

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
