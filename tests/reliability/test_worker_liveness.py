"""A worker that can no longer serve its jobs lets them go, soon: real worker processes.

- Its publisher thread dies (an exception raised inside the thread's own loop, as an
  error nothing catches would): the process exits with a non-zero status and the other
  worker finishes the stream. Before, the lease keeper went on refreshing the dead
  publisher's jobs, and their streams hung until the caller gave up.
- Its wall clock runs two minutes ahead: once it is killed, its job is still taken over
  within a lease and a watch period. Before, lease expiries were written and read with
  each worker's own clock, so the other worker saw the job's lease expire two minutes
  late.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.injected_faults import FAST, inject
from helpers.job_log import read_events, wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay import Client
from kvrelay.protocol import Finished, Started, Tokens

pytestmark = pytest.mark.integration

JOB: dict[str, Any] = {"prompt": "a question the simulated engine answers", "max_tokens": 300}
SKEW_S = 120.0


@pytest.fixture
def workers(clean_redis_url: str, tmp_path: Path, request: pytest.FixtureRequest
            ) -> Iterator[Callable[..., WorkerProcess]]:
    """``start(name, **faults)``: a simulated worker with ``FAST`` settings and faults."""
    started: list[WorkerProcess] = []

    def start(name: str, **faults: str) -> WorkerProcess:
        worker = inject(WorkerProcess(name, clean_redis_url, "simulated", tmp_path, **FAST),
                        **faults)
        started.append(worker.start())
        return worker.wait_ready()

    yield start
    for worker in started:
        worker.signal(signal.SIGCONT)
        worker.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for worker in started:
            print(f"\n----- worker {worker.name} log -----\n{worker.tail(6000)}")


def _serving(workers: list[WorkerProcess], url: str, job_id: str) -> WorkerProcess:
    started = [e for e in read_events(url, job_id) if isinstance(e, Started)][-1]
    pid = int(started.worker.rsplit(":", 1)[1])
    return next(w for w in workers if w.pid == pid)


def test_a_worker_whose_publisher_thread_dies_exits_and_its_stream_completes(
        workers: Callable[..., WorkerProcess], clean_redis_url: str, tmp_path: Path) -> None:
    triggers = {name: tmp_path / f"kill-{name}-publisher" for name in ("a", "b")}
    pool = [workers(name, kill_thread="kvrelay-publisher", kill_when=str(path))
            for name, path in triggers.items()]
    with Client(clean_redis_url, model="simulated", stream_timeout=20) as client:
        reference = client.generate(**JOB)
        seqs: list[int] = []
        with client.stream(**JOB) as stream:
            for chunk in stream:
                seqs.append(chunk.seq)
                if len(seqs) == 10:
                    victim = _serving(pool, clean_redis_url, stream.job_id)
                    triggers[victim.name].touch()  # its publisher thread dies now
            final = stream.final()
            job_id = stream.job_id
    assert victim.wait_exit(timeout=10) != 0
    assert final.token_ids == reference.token_ids
    assert final.finish_reason == "length"
    events = wait_terminal(clean_redis_url, job_id)
    assert isinstance(events[-1], Finished)
    assert [e.attempt for e in events if isinstance(e, Started)] == [1, 2]
    assert seqs == sorted(set(seqs))  # the caller saw each event once, in order


def test_a_worker_with_a_skewed_clock_has_its_job_taken_over_in_time(
        workers: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    ahead = workers("ahead", clock_skew_s=str(SKEW_S))
    with Client(clean_redis_url, model="simulated", stream_timeout=30) as client:
        # (A queue deadline far off: the worker ahead would judge it passed at pickup.)
        with client.stream(**(JOB | {"max_tokens": 3000}), queue_timeout=1000) as stream:
            for _ in zip(range(5), stream, strict=False):
                pass  # the job runs on the only worker, the one whose clock is ahead
            behind = workers("in-time")
            ahead.kill()
            killed_at = time.monotonic()
            deadline = killed_at + 30
            while not any(isinstance(e, Started) and e.attempt == 2
                          for e in read_events(clean_redis_url, stream.job_id)):
                assert time.monotonic() < deadline, "the job was never taken over"
                time.sleep(0.05)
            taken_over_after = time.monotonic() - killed_at
            client.cancel(stream.job_id)
    events = read_events(clean_redis_url, stream.job_id)
    assert any(isinstance(e, Tokens) for e in events)
    assert behind.alive()
    bound = FAST["lease_ttl"] + 2 * FAST["watchdog_interval"] + 3.0
    assert taken_over_after < bound, f"taken over after {taken_over_after:.1f}s (> {bound}s)"
