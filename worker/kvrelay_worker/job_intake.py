"""A delivered job's way from the task thread to its end: decode it, refuse what cannot
run, let the takeover throttle look at a copy of a job that ran before, claim it, hold it
while the engine runs it, and end what never gets that far.

Why apart from ``runtime``: the runtime wires the worker's threads together once; this is
what every task thread does per job, with its many endings (rejected, oversized,
deadline passed, cancelled before the claim, handed back, duplicate, fenced).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kvrelay.protocol import ErrorCode, Failed, GenerateRequest, Started, request_digest
from kvrelay_worker.intake.job_request import (
    JobRejected,
    decode_payload,
    prompt_ids_for,
    reply_to_of,
    sampling_params_from,
)
from kvrelay_worker.intake.pickup_checks import check_queue_wait
from kvrelay_worker.jobs.active_job import ActiveJob, Outcome
from kvrelay_worker.jobs.dead_deliveries import drop_delivery_records
from kvrelay_worker.jobs.held_writes import until_written
from kvrelay_worker.jobs.job_store import PriorProgress, run_id
from kvrelay_worker.jobs.publisher import EventItem
from kvrelay_worker.jobs.run_trace import record_run

log = logging.getLogger(__name__)

# How often a task thread waiting for its job checks that the engine thread still runs.
_LIVENESS_CHECK_S = 1.0
# How long the publisher gets to write the failure of a job whose engine died.
_PUBLISH_GRACE_S = 30.0


class JobIntake:
    """The per-job path of one worker (any task thread)."""

    def __init__(self, runtime: Any) -> None:
        # The ``WorkerRuntime`` that owns this intake (typed loosely: importing it here
        # would make the two modules a circle); every part a job needs hangs off it.
        self.runtime = runtime

    def reject(self, job_id: str | None, message: str) -> str:
        """Fail a delivered job as ``invalid_request`` without looking at its payload (one
        with no id is only counted)."""
        if not job_id:
            self.runtime.metrics.jobs.labels(outcome="rejected").inc()
            return "rejected"
        return self._end_unclaimed(job_id, ErrorCode.INVALID_REQUEST, message, "rejected")

    def drop_delivery(self, tag: str | None) -> None:
        """Remove the records of a message whose job ended here (``drop_delivery_records``)."""
        if tag:
            runtime = self.runtime
            until_written(lambda: drop_delivery_records(runtime.store.redis,
                                                        runtime.settings.keys, tag),
                          "the records of a delivered message", runtime.health)

    def refuse_oversized(self, job_id: str | None, size: int) -> str:
        """Fail a job whose message was too large to parse (seen by ``payload_gate``)."""
        if not job_id:
            return "rejected"
        return self._end_unclaimed(
            job_id, ErrorCode.PAYLOAD_TOO_LARGE,
            f"the job's message is {size} bytes; this worker accepts payloads of at most "
            f"{self.runtime.settings.max_payload_bytes}", "rejected")

    def _end_unclaimed(self, job_id: str, code: str, message: str, outcome: str,
                       reply_to: str = "") -> str:
        """Fail a job this worker did not claim (it never ran) and count the outcome."""
        until_written(lambda: self.runtime.store.fail_unclaimed(job_id, code, message,
                                                                reply_to=reply_to),
                      f"the end of job {job_id}", self.runtime.health)
        self.runtime.metrics.jobs.labels(outcome=outcome).inc()
        return outcome

    def run_job(self, job_id: str | None, payload: object) -> str:
        """Run one delivered job to its end on this worker; returns what happened."""
        if not job_id:
            log.warning("ignoring a task without an id")
            return "ignored"
        picked_at = time.time()
        settings = self.runtime.settings
        try:
            request, payload_json = decode_payload(payload, job_id, settings.served_model,
                                                   settings.max_payload_bytes)
        except JobRejected as rejected:
            return self._end_unclaimed(job_id, rejected.code, rejected.message, "rejected",
                                       reply_to_of(payload))
        if self.runtime.draining:
            until_written(lambda: self.runtime.requeue(job_id, payload_json),
                          f"the copy of job {job_id}", self.runtime.health)
            return Outcome.HANDBACK
        if request.deadline is not None and request.deadline <= time.time():
            return self._end_unclaimed(
                job_id, ErrorCode.DEADLINE_EXCEEDED,
                "the job's deadline passed before a worker picked it up", Outcome.DEADLINE,
                request.reply_to or "")
        reservation = self.runtime.takeovers.admit(job_id, request)
        if reservation is None:  # its re-prefill is for a survivor with room: unclaimed
            until_written(lambda: self.runtime.requeue(job_id, payload_json),
                          f"the copy of job {job_id}", self.runtime.health)
            self.runtime.metrics.jobs.labels(outcome=Outcome.HANDBACK).inc()
            return Outcome.HANDBACK
        try:
            return self._claim_and_run(job_id, request, payload_json, picked_at)
        finally:
            reservation.release()

    def _claim_and_run(self, job_id: str, request: GenerateRequest, payload_json: str,
                       picked_at: float) -> str:
        # The run this claim starts; a claim resent after a lost reply finds it its own.
        run = run_id(self.runtime.settings.worker_id)
        digest = request_digest(request)
        store = self.runtime.store
        claim = until_written(lambda: store.claim(job_id, payload_json, digest, run),
                              f"the claim of job {job_id}", self.runtime.health)
        if claim.status == "aborted":
            return self._end_unclaimed(job_id, ErrorCode.CANCELLED,
                                       "the job was cancelled before it started",
                                       Outcome.CANCELLED, request.reply_to or "")
        if claim.status == "reused":
            log.warning("refusing a copy of job %s: its request differs from the one the "
                        "job id belongs to", job_id)
            self.runtime.metrics.jobs.labels(outcome="rejected").inc()
            return "reused"
        if claim.status != "claimed" or claim.progress is None:
            log.info("dropping a copy of job %s (%s)", job_id, claim.status)
            return "duplicate"
        return self._run_claimed(job_id, request, payload_json, claim.attempt, claim.progress,
                                 run, picked_at)

    def _fail_claimed(self, request: GenerateRequest, prior: PriorProgress, code: str,
                      message: str, outcome: str, run: str) -> str:
        """End a job this worker claimed but cannot run: its ``Failed`` event, then done."""
        job_id = request.job_id
        failed = Failed(seq=prior.next_seq, code=code, message=message)
        until_written(lambda: self.runtime.store.append_event(
                          job_id, failed, fenced=run, reply_to=request.reply_to or ""),
                      f"the end of job {job_id}", self.runtime.health)
        until_written(lambda: self.runtime.store.release_done(job_id, run),
                      f"the end of job {job_id}", self.runtime.health)
        self.runtime.metrics.jobs.labels(outcome=outcome).inc()
        return outcome

    def _run_claimed(self, job_id: str, request: GenerateRequest, payload_json: str,
                     attempt: int, prior: PriorProgress, run: str,
                     picked_at: float = 0.0) -> str:
        if prior.terminal:
            until_written(lambda: self.runtime.store.release_done(job_id, run),
                          f"the end of job {job_id}", self.runtime.health)
            return "duplicate"
        if prior.truncated:
            return self._fail_claimed(
                request, prior, ErrorCode.LOG_TRUNCATED,
                "the job's worker died and its replay log no longer starts at its first event "
                "(over KVRELAY_LOG_MAX_LEN or KVRELAY_LOG_MAX_BYTES): it cannot be continued",
                Outcome.FAILED, run)
        runtime, engine = self.runtime, self.runtime.engine
        try:
            check_queue_wait(request, attempt, time.time(), runtime.settings.max_queue_wait,
                             lambda: runtime.store.picked_in_time(job_id))
            params = sampling_params_from(request, runtime.parsers)
            prompt_ids = prompt_ids_for(request, engine.tokenizer, engine.vocab_size,
                                        engine.max_model_len)
        except JobRejected as rejected:
            return self._fail_claimed(request, prior, rejected.code, rejected.message,
                                      "rejected", run)
        job = ActiveJob(job_id=job_id, request=request, payload_json=payload_json,
                        params=params, prompt_ids=prompt_ids, attempt=attempt, prior=prior,
                        run_id=run, next_seq=prior.next_seq, picked_at=picked_at,
                        cache_salt=self.runtime.settings.keys.cache_salt(request.cache_salt))
        with self.runtime.jobs.hold(job) as holds:
            if not holds:
                return Outcome.FENCED
            if attempt == 1 and request.enqueued_at:
                runtime.metrics.queue_time.observe(max(0.0,
                                                       job.claimed_at - request.enqueued_at))
            started = Started(seq=0, worker=self.runtime.settings.worker_name, attempt=attempt,
                              prompt_tokens=len(prompt_ids), run=run)
            if self.runtime.settings.enable_prefix_caching:
                self.runtime.prefixes.note(request)
            # Started leaves with the next step's events while steps are short.
            self.runtime.service.submit(job, [EventItem(job, started)])
            self._wait_for_end(job)
        record_run(job, self.runtime.settings.worker_name)  # its spans, now that it is over
        return job.outcome or "unknown"

    def _wait_for_end(self, job: ActiveJob) -> None:
        """Wait for the job's end, but not past the death of the engine thread that would
        have ended it: then the job fails as ``internal`` and the Celery slot is freed."""
        while not job.done.wait(_LIVENESS_CHECK_S):
            if self.runtime.service.is_alive():
                continue
            log.error("the engine thread is gone; failing job %s", job.job_id)
            self.runtime.publisher.put([EventItem(job, Failed(
                seq=0, code=ErrorCode.INTERNAL, message="the worker's engine stopped"),
                Outcome.FAILED)])
            if not job.done.wait(_PUBLISH_GRACE_S):
                job.finish(Outcome.FAILED)  # the publisher is stuck too: stop waiting
            return
