"""A worker that stalls past its lease and wakes up after its job ended elsewhere writes
nothing more: not to the log, not on the wire.

Two real (simulated-engine) workers. The one running a long job is SIGSTOPped; the job
is cancelled, or its deadline passes; its lease runs out, the other worker's watch
requeues it, and that worker's pickup ends it (``Failed``: cancelled, or deadline
exceeded). Then the stalled worker is SIGCONTed: its engine, publisher and lease keeper
go on from where they were. Before every ending fenced, that pickup's ending left the
stalled run's record and fence flag as they were, so the woken worker's batches went
out unchecked: tokens were published after ``Failed`` and its moves (and its own
``Failed`` for the deadline) landed in the log after it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chaos.tap import WireTap
from helpers.celery_send import greedy_request, send_requests
from helpers.job_log import read_events, read_log, wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay import Client
from kvrelay.keys import Keyspace
from kvrelay.protocol import TERMINAL_EVENTS, Started, Tokens

pytestmark = pytest.mark.integration

KEYS = Keyspace()
# A longer lease than the deadline below, so the job is requeued only once it passed.
SETTINGS: dict[str, Any] = {"concurrency": 4, "simulated_step_ms": 20, "lease_ttl": 3.0,
            "lease_refresh": 0.5, "watchdog_interval": 0.5}
DEADLINE_S = 2.0


@pytest.fixture
def workers(clean_redis_url: str, tmp_path: Path,
            request: pytest.FixtureRequest) -> Iterator[list[WorkerProcess]]:
    started = [WorkerProcess(name, clean_redis_url, "simulated", tmp_path, **SETTINGS).start()
               for name in ("stalls", "lives")]
    try:
        yield [worker.wait_ready() for worker in started]
    finally:
        for worker in started:
            worker.signal(signal.SIGCONT)
            worker.stop()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            for worker in started:
                print(f"\n----- worker {worker.name} log -----\n{worker.tail(6000)}")


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise TimeoutError(what)


@pytest.mark.parametrize("ending", ["cancelled", "deadline"])
def test_a_woken_stalled_run_writes_nothing_after_the_end(
        workers: list[WorkerProcess], clean_redis_url: str, ending: str) -> None:
    tap = WireTap(clean_redis_url).start()
    try:
        request = greedy_request("simulated", [5, 6, 7], 3000)
        request.reply_to = KEYS.reply_channel("tap-client")
        if ending == "deadline":
            request.deadline = request.enqueued_at + DEADLINE_S
        send_requests(clean_redis_url, [request])
        job_id = request.job_id
        _wait(lambda: any(isinstance(e, Tokens) for e in read_events(clean_redis_url, job_id)),
              20, "the job never started")
        started = next(e for e in read_events(clean_redis_url, job_id) if isinstance(e, Started))
        victim = next(w for w in workers if w.pid == int(started.worker.rsplit(":", 1)[1]))
        victim.signal(signal.SIGSTOP)  # stalls past its lease
        if ending == "cancelled":
            with Client(clean_redis_url, model="simulated") as client:
                client.cancel(job_id)
        ended = wait_terminal(clean_redis_url, job_id, timeout=30)
        assert getattr(ended[-1], "code", None) == (
            "cancelled" if ending == "cancelled" else "deadline_exceeded"), ended[-1]
        log_at_end = read_log(clean_redis_url, job_id)
        end_seq = log_at_end[-1].seq

        victim.signal(signal.SIGCONT)  # its threads go on where they were
        time.sleep(4.0)  # a lease refresh, batches, the engine's own deadline: all had time

        assert read_log(clean_redis_url, job_id) == log_at_end
        late = [t.event for t in tap.of(job_id) if t.event.seq > end_seq]
        assert late == [], f"published after the end (seq {end_seq}): {late[:3]}"
        assert sum(isinstance(t.event, TERMINAL_EVENTS) for t in tap.of(job_id)) <= 1
        assert victim.alive()
    finally:
        tap.stop()
