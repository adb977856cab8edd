"""Claims of one job that reach the same worker while its earlier run is still stopping.

A worker stalled past its leases (SIGSTOP, a loaded machine) gets its own jobs back, and
its earlier run of one can take seconds to stop while the engine is slow: meanwhile the
waiting claim's lease must be kept, and a further claim of the same job (its lease had
run out) supersedes the one still waiting. Before, each waiting run kept no lease (so the
job was requeued and claimed again behind it), every waiting run started once the first
one stopped, and all but the last were dropped by the engine unreported: their task
threads waited until shutdown (chaos seed 20 under load).

The real ``OwnedJobs`` and ``EngineService`` (simulated engine, slow steps, so an abort
takes effect only at a step's end); the publisher ends a job as the real one does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import cast

import pytest
import redis

from kvrelay.protocol import GenerateRequest
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine_service import EngineService
from kvrelay_worker.jobs.active_job import ActiveJob, Outcome
from kvrelay_worker.jobs.job_store import JobStore, PriorProgress
from kvrelay_worker.jobs.owned_jobs import OwnedJobs
from kvrelay_worker.jobs.publisher import DoneItem, EventItem, Item, Publisher
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.settings import WorkerSettings
from kvrelay_worker.simulated.engine import SimulatedEngine
from kvrelay_worker.simulated.step_time import StepTimeModel

STEP_MS = 400.0


class EndingPublisher:
    """Ends each job when the engine thread hands over its last item, as the publisher
    does once that item is written."""

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.lock = threading.Lock()

    def put(self, items: list[Item]) -> None:
        for item in items:
            if isinstance(item, DoneItem):
                item.job.finish(item.outcome)
            elif isinstance(item, EventItem):
                with self.lock:
                    self.tokens[item.job.run_id] = self.tokens.get(item.job.run_id, 0) + 1
                if item.outcome is not None:
                    item.job.finish(item.outcome)


def _run(attempt: int) -> ActiveJob:
    request = GenerateRequest(job_id="j", model="simulated", prompt_token_ids=[5, 6, 7])
    return ActiveJob(job_id="j", request=request, payload_json="",
                     params=SamplingParams(max_tokens=500, ignore_eos=True),
                     prompt_ids=[5, 6, 7], attempt=attempt, prior=PriorProgress(),
                     run_id=f"w#{attempt}")


@pytest.fixture
def setup(clean_redis_url: str) -> Iterator[tuple[OwnedJobs, EngineService, EndingPublisher]]:
    publisher = EndingPublisher()
    service = EngineService(
        lambda: SimulatedEngine(StepTimeModel(step_ms=STEP_MS, token_ms=0.0)),
        cast(Publisher, publisher), WorkerMetrics("simulated"))
    service.start()
    client = redis.Redis.from_url(clean_redis_url)
    store = JobStore(client, WorkerSettings(redis_url=clean_redis_url, model_name="simulated",
                                            worker_id="w"))
    try:
        yield OwnedJobs(service, store), service, publisher
    finally:
        service.stop()
        client.close()


class RunThread(threading.Thread):
    """A task thread: holds its run, starts it if it may, waits for its end."""

    def __init__(self, jobs: OwnedJobs, service: EngineService, run: ActiveJob) -> None:
        super().__init__(daemon=True)
        self.jobs, self.service, self.run_ = jobs, service, run
        self.holds: bool | None = None
        self.ended = threading.Event()

    def run(self) -> None:
        with self.jobs.hold(self.run_) as holds:
            self.holds = holds
            if holds:
                self.service.submit(self.run_, [])
                self.run_.done.wait(60)
        self.ended.set()


def _started(publisher: EndingPublisher, run: ActiveJob) -> None:
    deadline = time.monotonic() + 30
    while publisher.tokens.get(run.run_id, 0) == 0:
        assert time.monotonic() < deadline, f"{run.run_id} never produced a token"
        time.sleep(0.01)


def test_the_newest_claim_runs_and_the_ones_waiting_behind_it_end(
        setup: tuple[OwnedJobs, EngineService, EndingPublisher]) -> None:
    jobs, service, publisher = setup
    first, second, third = _run(1), _run(2), _run(3)
    threads = [RunThread(jobs, service, run) for run in (first, second, third)]
    threads[0].start()
    _started(publisher, first)
    threads[1].start()  # claimed again: waits for the first run to stop
    deadline = time.monotonic() + 5
    while jobs.jobs() != [second]:  # registered at once: its lease is kept while it waits
        assert time.monotonic() < deadline, jobs.jobs()
        time.sleep(0.005)
    threads[2].start()  # and again, before the first run has stopped
    for thread in threads[:2]:
        assert thread.ended.wait(30), f"run {thread.run_.run_id} never ended"
    assert first.outcome == Outcome.FENCED
    assert threads[1].holds is False  # superseded while it waited: it never started
    assert second.outcome == Outcome.FENCED
    assert publisher.tokens.get(second.run_id, 0) == 0
    _started(publisher, third)
    assert threads[2].holds is True
    assert jobs.jobs() == [third]
    jobs.fence("j")
    assert threads[2].ended.wait(30)
    assert third.outcome == Outcome.FENCED


def test_an_older_claim_arriving_late_does_not_stop_the_newer_run(
        setup: tuple[OwnedJobs, EngineService, EndingPublisher]) -> None:
    jobs, service, publisher = setup
    newer, older = _run(3), _run(2)
    running = RunThread(jobs, service, newer)
    running.start()
    _started(publisher, newer)
    late = RunThread(jobs, service, older)
    late.start()
    assert late.ended.wait(10)
    assert late.holds is False
    assert older.outcome == Outcome.FENCED
    tokens = publisher.tokens[newer.run_id]
    time.sleep(3 * STEP_MS / 1000)
    assert publisher.tokens[newer.run_id] > tokens  # still running
    assert not newer.done.is_set()
    jobs.fence("j")
    assert running.ended.wait(30)
