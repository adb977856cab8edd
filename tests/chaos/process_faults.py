"""Faults done to worker processes beside a caller's move: a worker SIGKILLed right as
its job's caller cancels (``cancel_race``), and a worker drained by SIGTERM, handing its
jobs back, then started again (``worker_drain``). Each returns what it did; one that
could not be done raises (a harness error: the seed fails).
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import TYPE_CHECKING

from chaos.cluster import POLL_ERRORS, ChaosCluster, WorkerSlot, wait_until
from chaos.schedule import CANCEL_RACE, WORKER_DRAIN, FaultPlan
from kvrelay.event_log import OWNER_FIELD
from kvrelay.keys import Keyspace

if TYPE_CHECKING:
    from chaos.workload import Workload

KEYS = Keyspace()
# How long the racing job may take to show its first chunk before its worker is killed.
RACE_WAIT_S = 10.0
# How long the owner of the racing job is asked for while Redis is out of reach.
OWNER_WAIT_S = 15.0
# How long a drained worker may take to hand its jobs back and exit (its shutdown grace
# is 2 s; Celery's own shutdown follows).
DRAIN_EXIT_S = 30.0
# How long a worker started by an earlier fault may take to be ready before its drain.
READY_WAIT_S = 60.0


def apply_process_fault(cluster: ChaosCluster, workload: Workload, fault: FaultPlan) -> str:
    if fault.kind == CANCEL_RACE:
        return _cancel_race(cluster, workload, fault)
    if fault.kind == WORKER_DRAIN:
        return _drain(cluster.slots[fault.target], fault.duration)
    raise ValueError(f"not a process fault: {fault.kind}")


def _owner_slot(cluster: ChaosCluster, job_id: str) -> WorkerSlot | None:
    """The slot whose current worker holds ``job_id`` now (its record's owner), if any."""
    with cluster.admin() as client:
        owner = client.hget(KEYS.job_record(job_id), OWNER_FIELD)
        state = client.hget(KEYS.job_record(job_id), "state")
    if owner is None or state != b"running":
        return None
    pid = owner.decode().split(":")[1]
    return next((slot for slot in cluster.slots if slot.current.process is not None
                 and str(slot.current.process.pid) == pid), None)


def _owner_slot_through_outages(cluster: ChaosCluster, job_id: str) -> WorkerSlot | None:
    """``_owner_slot``, asked again while Redis is out of reach (another fault restarts
    or fails it over) for up to ``OWNER_WAIT_S``."""
    give_up = time.monotonic() + OWNER_WAIT_S
    while True:
        try:
            return _owner_slot(cluster, job_id)
        except POLL_ERRORS:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.2)


def _cancel_race(cluster: ChaosCluster, workload: Workload, fault: FaultPlan) -> str:
    """Once job ``target`` streams, its caller cancels it and, in the same instant, the
    worker running it is SIGKILLed (restarted after ``duration``): the cancel races the
    takeover. A job that ended first still gets a worker killed (slot 0)."""
    run = workload.runs[fault.target]
    wait_until(lambda: bool(run.chunks) or (run.outcome != "not run" and not run.live),
               RACE_WAIT_S, 0.02)
    slot = _owner_slot_through_outages(cluster, run.job_id)
    note = "" if slot is not None else " (the job was not running: killed slot 0)"
    slot = slot or cluster.slots[0]
    name = slot.current.name
    workload.cancel_soon(fault.target)
    slot.kill()
    time.sleep(fault.duration)
    return f"cancelled job {fault.target} as {name} was killed{note}, started {slot.start().name}"


def _drain(slot: WorkerSlot, restart_after: float) -> str:
    """SIGTERM to a running worker (one still starting is waited for: it has no jobs to
    hand back, and dies of the signal): it hands its jobs back and exits 0, and the slot
    is started again ``restart_after`` later. Worker faults on one slot may overlap: a
    worker another fault SIGKILLs before or during its drain is that fault's to restart."""
    slot.cont()
    worker = slot.current
    give_up = time.monotonic() + READY_WAIT_S
    while True:
        try:
            worker.wait_ready(max(1.0, give_up - time.monotonic()))
            break
        except RuntimeError:  # "exited early": it was killed meanwhile
            if worker.alive() or worker.wait_exit(1) != -signal.SIGKILL:
                raise
            return f"{worker.name} was killed by another fault before its drain"
        except POLL_ERRORS:  # its heartbeat is read from a Redis failing over
            if time.monotonic() > give_up:
                raise
            time.sleep(0.2)
    worker.signal(signal.SIGTERM)
    try:
        status: int | str = worker.wait_exit(DRAIN_EXIT_S)
    except subprocess.TimeoutExpired:
        status = "still running"
        worker.kill()
    if status == -signal.SIGKILL:
        return f"{worker.name} was killed by another fault while it drained"
    time.sleep(restart_after)
    started = slot.start().name
    if status != 0:
        outcome = f"exited {status}" if isinstance(status, int) else \
            f"was {status} {DRAIN_EXIT_S:g}s"
        raise RuntimeError(f"{worker.name} {outcome} after SIGTERM (started {started}):\n"
                           f"{worker.tail(800)}")
    return f"drained {worker.name} (exit 0), started {started}"
