"""Everything one worker process runs besides Celery itself, wired together.

Created once per process by the worker bootstep: loads the engine, then starts the
engine thread, the publisher thread, the lease keeper and the control listener. Task
threads enter through ``run_job``; shutdown goes through ``shutdown`` (graceful: finish
within the grace period, hand the rest back).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import redis

from kvrelay.protocol import ErrorCode, Failed, GenerateRequest, Started, WorkerInfo
from kvrelay_worker.active_job import ActiveJob, Outcome
from kvrelay_worker.control_listener import ControlListener
from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.llm_engine import LLMEngine
from kvrelay_worker.engine_service import EngineService
from kvrelay_worker.job_request import (
    JobRejected,
    decode_payload,
    prompt_ids_for,
    sampling_params_from,
)
from kvrelay_worker.job_store import JobStore, PriorProgress
from kvrelay_worker.lease_keeper import LeaseKeeper
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.publisher import EventItem, Publisher
from kvrelay_worker.settings import WorkerSettings

log = logging.getLogger(__name__)

Requeue = Callable[[str, str], None]


class WorkerRuntime:
    def __init__(self, settings: WorkerSettings, requeue: Requeue,
                 engine: LLMEngine | None = None) -> None:
        self.settings = settings
        self.requeue_fn = requeue
        self.metrics = WorkerMetrics(settings.served_model)
        self.started_at = time.time()
        self.store = JobStore(self._redis(), settings)
        self.publisher = Publisher(JobStore(self._redis(), settings), self.metrics,
                                   requeue=self._requeue, on_fenced=self._on_fenced)

        def make_engine() -> LLMEngine:
            if engine is not None:
                return engine
            config = EngineConfig(**settings.engine_options())  # type: ignore[arg-type]
            return LLMEngine(config, progress=False)

        self.service = EngineService(make_engine, self.publisher, self.metrics)
        self.engine = self.service.start()  # loads the model (on the engine's own thread)
        self.metrics.watch_engine(self.service.stats)
        self.leases = LeaseKeeper(JobStore(self._redis(), settings), settings,
                                  owned_jobs=self.owned_job_ids, on_lost=self._on_fenced_id,
                                  on_aborted=self._on_abort, requeue=self._requeue,
                                  worker_info=self.worker_info)
        self.control = ControlListener(self._redis(), settings.keys.control_channel,
                                       on_abort=self._on_abort)
        self._owned: dict[str, ActiveJob] = {}
        self._lock = threading.Lock()
        self.draining = False
        self.metrics_port: int | None = None

    def _redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.settings.redis_url, health_check_interval=30,
                                    socket_keepalive=True)

    # --------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.publisher.start()
        self.control.start()
        self.leases.start()
        if self.settings.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.settings.metrics_port)
        stats = self.engine.stats()
        log.info("kvrelay worker %s ready: model %s on %s, %d KV blocks of %d tokens",
                 self.settings.worker_id, self.settings.served_model, self.engine.device,
                 stats["total_blocks"], stats["block_size"])

    def shutdown(self, grace: float | None = None) -> None:
        """Stop taking jobs; let running ones finish within ``grace``; hand back the rest."""
        grace = self.settings.shutdown_grace if grace is None else grace
        self.draining = True
        log.info("kvrelay worker draining: %d jobs held, grace %.0fs", len(self._owned), grace)
        for job in self.owned_jobs():
            if job.first_token_at is None and not job.prior.has_tokens:
                self.service.abort(job.job_id, Outcome.HANDBACK)
        deadline = time.monotonic() + grace
        while self._owned and time.monotonic() < deadline:
            time.sleep(0.05)
        for job in self.owned_jobs():
            self.service.abort(job.job_id, Outcome.HANDBACK)
        deadline = time.monotonic() + 10.0
        while self._owned and time.monotonic() < deadline:
            time.sleep(0.05)
        self.leases.stop()
        self.control.stop()
        self.service.stop()
        self.publisher.stop()
        log.info("kvrelay worker stopped")

    # ------------------------------------------------------------ bookkeeping

    def owned_jobs(self) -> list[ActiveJob]:
        with self._lock:
            return list(self._owned.values())

    def owned_job_ids(self) -> list[str]:
        with self._lock:
            return list(self._owned)

    def worker_info(self) -> WorkerInfo:
        return WorkerInfo(
            worker_id=self.settings.worker_id, model=self.settings.served_model,
            host=self.settings.host, pid=os.getpid(), device=str(self.engine.device),
            concurrency=self.settings.concurrency, started_at=self.started_at,
            updated_at=time.time(), jobs_running=len(self._owned), draining=self.draining,
            stats=self.service.stats(),
            max_payload_bytes=self.settings.max_payload_bytes,
        )

    def _requeue(self, job_id: str, payload_json: str) -> None:
        self.requeue_fn(job_id, payload_json)

    def _on_abort(self, job_id: str) -> None:
        if job_id in self._owned:
            self.service.abort(job_id, Outcome.CANCELLED)

    def _on_fenced(self, job: ActiveJob) -> None:
        self._on_fenced_id(job.job_id)

    def _on_fenced_id(self, job_id: str) -> None:
        if job_id in self._owned:
            self.service.abort(job_id, Outcome.FENCED)

    # ------------------------------------------------------------------- jobs

    def reject(self, job_id: str | None, message: str) -> str:
        """Fail a delivered job as ``invalid_request`` without looking at its payload."""
        if not job_id:
            return "rejected"
        return self._end_unclaimed(job_id, ErrorCode.INVALID_REQUEST, message, "rejected")

    def refuse_oversized(self, job_id: str | None, size: int) -> str:
        """Fail a job whose message was too large to parse (seen by ``payload_gate``)."""
        if not job_id:
            return "rejected"
        return self._end_unclaimed(
            job_id, ErrorCode.PAYLOAD_TOO_LARGE,
            f"the job's message is {size} bytes; this worker accepts payloads of at most "
            f"{self.settings.max_payload_bytes}", "rejected")

    def _end_unclaimed(self, job_id: str, code: str, message: str, outcome: str) -> str:
        """Fail a job this worker did not claim (it never ran) and count the outcome."""
        self.store.fail_unclaimed(job_id, code, message)
        self.metrics.jobs.labels(outcome=outcome).inc()
        return outcome

    def run_job(self, job_id: str | None, payload: object) -> str:
        """Run one delivered job to its end on this worker; returns what happened."""
        if not job_id:
            log.warning("ignoring a task without an id")
            return "ignored"
        try:
            request, payload_json = decode_payload(payload, job_id, self.settings.served_model,
                                                   self.settings.max_payload_bytes)
        except JobRejected as rejected:
            return self._end_unclaimed(job_id, rejected.code, rejected.message, "rejected")
        if self.draining:
            self._requeue(job_id, payload_json)
            return Outcome.HANDBACK
        if request.deadline is not None and request.deadline <= time.time():
            return self._end_unclaimed(
                job_id, ErrorCode.DEADLINE_EXCEEDED,
                "the job's deadline passed before a worker picked it up", Outcome.DEADLINE)
        claim = self.store.claim(job_id, payload_json)
        if claim.status == "aborted":
            return self._end_unclaimed(job_id, ErrorCode.CANCELLED,
                                       "the job was cancelled before it started",
                                       Outcome.CANCELLED)
        if claim.status != "claimed" or claim.progress is None:
            log.info("dropping a copy of job %s (%s)", job_id, claim.status)
            return "duplicate"
        return self._run_claimed(job_id, request, payload_json, claim.attempt, claim.progress)

    def _run_claimed(self, job_id: str, request: GenerateRequest, payload_json: str,
                     attempt: int, prior: PriorProgress) -> str:
        if prior.terminal:
            self.store.release_done(job_id)
            return "duplicate"
        try:
            params = sampling_params_from(request)
            prompt_ids = prompt_ids_for(request, self.engine.tokenizer, self.engine.vocab_size,
                                        self.engine.max_model_len)
        except JobRejected as rejected:
            self.store.append_event(job_id, Failed(seq=prior.next_seq, code=rejected.code,
                                                   message=rejected.message), fenced=True)
            self.store.release_done(job_id)
            self.metrics.jobs.labels(outcome="rejected").inc()
            return "rejected"
        job = ActiveJob(job_id=job_id, request=request, payload_json=payload_json,
                        params=params, prompt_ids=prompt_ids, attempt=attempt, prior=prior,
                        next_seq=prior.next_seq,
                        cache_salt=self.settings.keys.cache_salt(request.cache_salt))
        with self._lock:
            self._owned[job_id] = job
        try:
            if attempt == 1 and request.enqueued_at:
                self.metrics.queue_time.observe(max(0.0, job.claimed_at - request.enqueued_at))
            started = Started(seq=0, worker=self.settings.worker_name, attempt=attempt,
                              prompt_tokens=len(prompt_ids))
            self.publisher.put([EventItem(job, started)])
            self.service.submit(job)
            job.done.wait()
        finally:
            with self._lock:
                self._owned.pop(job_id, None)
        if job.outcome in (Outcome.FINISHED, Outcome.FAILED, Outcome.CANCELLED,
                           Outcome.DEADLINE):
            self.store.release_done(job_id)
        return job.outcome or "unknown"
