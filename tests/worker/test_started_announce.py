"""A job's ``Started`` leaves with the next engine step's events (one publisher batch for
both, so a job's arrival costs Redis no script call of its own), unless steps are long:
then it leaves at once, so a stream hears of its pickup about as soon as before."""

from __future__ import annotations

import threading
import time
from typing import cast

from kvrelay.protocol import GenerateRequest, Started, Tokens
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine_service import _ANNOUNCE_WITH_STEPS_UNDER_S, EngineService
from kvrelay_worker.jobs.active_job import ActiveJob
from kvrelay_worker.jobs.job_store import PriorProgress
from kvrelay_worker.jobs.publisher import EventItem, Item, Publisher
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.simulated.engine import SimulatedEngine
from kvrelay_worker.simulated.step_time import StepTimeModel


class BatchRecorder:
    """The publisher's side of the engine thread: each ``put`` is one batch."""

    def __init__(self) -> None:
        self.batches: list[list[Item]] = []
        self.lock = threading.Lock()

    def put(self, items: list[Item]) -> None:
        with self.lock:
            self.batches.append(list(items))

    def batch_of(self, job_id: str, kind: type) -> list[tuple[str, str]]:
        """(job, event type) of every item in the batch holding ``job_id``'s ``kind``."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with self.lock:
                for batch in self.batches:
                    if any(isinstance(i, EventItem) and i.job.job_id == job_id
                           and isinstance(i.event, kind) for i in batch):
                        return [(i.job.job_id, type(i.event).__name__) for i in batch
                                if isinstance(i, EventItem)]
            time.sleep(0.01)
        raise TimeoutError(f"no {kind.__name__} of {job_id}")


def _job(job_id: str, max_tokens: int) -> ActiveJob:
    request = GenerateRequest(job_id=job_id, model="simulated", prompt_token_ids=[5, 6, 7])
    return ActiveJob(job_id=job_id, request=request, payload_json="",
                     params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                     prompt_ids=[5, 6, 7], attempt=1, prior=PriorProgress())


def _service(step_ms: float, recorder: BatchRecorder) -> EngineService:
    return EngineService(lambda: SimulatedEngine(StepTimeModel(step_ms=step_ms, token_ms=0.0)),
                         cast(Publisher, recorder), WorkerMetrics("simulated"))


def _submit(service: EngineService, job: ActiveJob) -> None:
    service.submit(job, [EventItem(job, Started(seq=0, worker="w"))])


def test_short_steps_send_started_with_the_first_tokens() -> None:
    recorder = BatchRecorder()
    service = _service(5.0, recorder)
    service.start()
    try:
        _submit(service, _job("a", 50))
        assert recorder.batch_of("a", Started)[:2] == [("a", "Started"), ("a", "Tokens")]
        _submit(service, _job("b", 3))  # arrives while "a" is decoding
        batch = recorder.batch_of("b", Started)
        assert ("b", "Tokens") in batch
        assert ("a", "Tokens") in batch  # the step both took part in
    finally:
        service.stop()


def test_after_a_long_step_started_is_sent_at_once() -> None:
    recorder = BatchRecorder()
    service = _service(_ANNOUNCE_WITH_STEPS_UNDER_S * 1000 + 200, recorder)
    service.start()
    try:
        _submit(service, _job("a", 3))
        recorder.batch_of("a", Tokens)  # one long step has run
        _submit(service, _job("b", 3))
        assert recorder.batch_of("b", Started) == [("b", "Started")]
    finally:
        service.stop()
