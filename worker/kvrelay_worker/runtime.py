"""Everything one worker process runs besides Celery itself, wired together.

Created once per process by the worker bootstep: loads the engine, then starts the
engine thread, the publisher thread, the lease keeper, the heartbeat, the failover watch
and the control listener, all over one Redis connection pool; a watch on the vital ones
(``vital_threads``) reports the death of any (the bootstep ends the process then). Task threads enter through
``run_job``; the jobs they hold live in one registry (``OwnedJobs``); shutdown goes
through ``shutdown`` (graceful: finish within the grace period, hand the rest back).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvrelay.protocol import (
    AdapterMessage,
    ErrorCode,
    Failed,
    GenerateRequest,
    Started,
    WorkerInfo,
    request_digest,
)
from kvrelay.tracing import switch as tracing
from kvrelay_worker.control_listener import ControlListener
from kvrelay_worker.engine.chat import template_text
from kvrelay_worker.engine.tools.model_parsers import ModelParsers
from kvrelay_worker.engine_service import EngineService
from kvrelay_worker.heartbeat import Heartbeat
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
from kvrelay_worker.jobs.failover import Failover, Requeue
from kvrelay_worker.jobs.held_writes import until_written
from kvrelay_worker.jobs.job_store import JobStore, PriorProgress, run_id
from kvrelay_worker.jobs.lease_keeper import LeaseKeeper
from kvrelay_worker.jobs.orphan_queues import OrphanQueues
from kvrelay_worker.jobs.owned_jobs import OwnedJobs
from kvrelay_worker.jobs.publisher import EventItem, Publisher
from kvrelay_worker.jobs.run_trace import record_run
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.probes import WorkerProbes
from kvrelay_worker.recent_prefixes import RecentPrefixes, prefix_capacity
from kvrelay_worker.redis_client import worker_redis
from kvrelay_worker.redis_health import RedisHealth
from kvrelay_worker.served_adapters import ServedAdapters
from kvrelay_worker.served_engine import ServedEngine
from kvrelay_worker.settings import WorkerSettings
from kvrelay_worker.vital_threads import VitalThreads

if TYPE_CHECKING:
    from kvrelay_worker.cpu_threads import ThreadChoice
    from kvrelay_worker.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)

# How often a task thread waiting for its job checks that the engine thread still runs.
_LIVENESS_CHECK_S = 1.0
# How long the publisher gets to write the failure of a job whose engine died.
_PUBLISH_GRACE_S = 30.0


class WorkerRuntime:
    def __init__(self, settings: WorkerSettings, requeue: Requeue,
                 engine: LLMEngine | None = None, *, own_queue: bool = False,
                 on_thread_death: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        # Called with the name of a vital thread that died (the worker process passes
        # ``vital_threads.exit_for_dead_thread``; None: only logged, for in-process use).
        self.on_thread_death = on_thread_death
        # Whether Celery consumes this worker's own queue: only then may clients place
        # jobs on it, so only then does the heartbeat advertise prefixes.
        self.own_queue = own_queue
        self.requeue = requeue
        self.metrics = WorkerMetrics(settings.served_model)
        self.started_at = time.time()
        # What /ready and /live answer (``probes``). They are served beside the metrics from
        # here on, before Redis is awaited and the model loads, so an orchestrator sees a
        # live worker that is not ready yet rather than a refused connection; and before the
        # first heartbeat, which carries the bound port (0 picks a free one).
        self.probes = WorkerProbes()
        self.metrics_port: int | None = None
        if settings.metrics_port is not None:
            self.metrics_port = self.metrics.serve(settings.metrics_port,
                                                   settings.metrics_host, self.probes)
            log.info("kvrelay worker metrics on %s port %d", settings.metrics_host,
                     self.metrics_port)
        # The process's one connection pool: every thread below borrows from it.
        self.redis = worker_redis(settings)
        self.store = JobStore(self.redis, settings)
        # kvrelay's Redis Functions: loaded now (a tenant's user, which may not load them,
        # fails here when an admin has not); a namespace needs a Redis that has them. A
        # Redis out of reach or failing over is waited for, as Celery waits for its broker.
        until_written(self.store.scripts.prepare, "the load of kvrelay's Redis functions")
        # Since when this process's writes get through (failover judges leases by it).
        self.health = RedisHealth()

        # torch's intra-op thread count (KVRELAY_CPU_THREADS) and why, for the ready line.
        self.cpu_threads: ThreadChoice | None = None
        if not settings.simulated:
            # torch and the engine load here, on the main thread, before any other thread
            # starts (as when this module imported them); a simulated worker never loads them.
            import kvrelay_worker.engine.llm_engine  # noqa: F401
            from kvrelay_worker.cpu_threads import apply_cpu_threads

            # Before the engine thread's first op: it picks the count up at its first one.
            self.cpu_threads = apply_cpu_threads(settings.cpu_threads)

        # The LoRA adapters this worker serves (KVRELAY_LORA_MODULES, then control messages).
        self.adapters = ServedAdapters(settings.served_model)

        def make_engine() -> ServedEngine:
            built = build_engine()
            self.adapters.load_at_start(built, settings.lora_module_list)
            return built

        def build_engine() -> ServedEngine:
            if engine is not None:
                return engine
            if settings.simulated:
                return simulated_engine(settings)
            from kvrelay_worker.engine.config import EngineConfig  # torch: only when used
            from kvrelay_worker.engine.llm_engine import LLMEngine

            config = EngineConfig(**settings.engine_options())  # type: ignore[arg-type]
            return LLMEngine(config, progress=False)

        self.publisher = Publisher(self.store, self.metrics, requeue=requeue,
                                   on_fenced=lambda job: self.jobs.fence(job.job_id),
                                   health=self.health)
        self.service = EngineService(make_engine, self.publisher, self.metrics,
                                     adapters=self.adapters)
        self.jobs = OwnedJobs(self.service, self.store, self.health)
        self.engine = self.service.start()  # loads the model (on the engine's own thread)
        self.probes.engine_loaded(self.service.is_alive)
        # The syntax the model writes tool calls and reasoning in (KVRELAY_TOOL_PARSER,
        # KVRELAY_REASONING_PARSER; auto: read from its chat template).
        self.parsers = ModelParsers.resolve(template_text(self.engine.tokenizer, True),
                                            settings.tool_parser, settings.reasoning_parser)
        self.metrics.watch_engine(self.service.stats)
        engine_stats = self.engine.stats()
        # What the prefix cache most likely holds, advertised for placement.
        self.prefixes = RecentPrefixes(prefix_capacity(
            int(engine_stats["total_blocks"]) * int(engine_stats["block_size"])))
        self.leases = LeaseKeeper(self.store, settings, self.jobs, self.health,
                                  publisher_stuck_for=self.publisher.stuck_for)
        self.heartbeat = Heartbeat(self.redis, settings, self.worker_info, self.health)
        self.orphans = OrphanQueues(self.redis, settings, self.heartbeat.ttl_ms / 1000,
                                    self.store.scripts)
        self.failover = Failover(self.store, settings, requeue, self.orphans, self.health)
        self.control = ControlListener(self.redis, settings.keys.control_channel,
                                       on_abort=self.jobs.abort, on_adapter=self._on_adapter)
        self.vital = VitalThreads({"engine": self.service.is_alive,
                                   "publisher": self.publisher.is_alive,
                                   "lease keeper": self.leases.is_alive,
                                   "control listener": self.control.is_alive},
                                  on_death=self._thread_died)
        self.draining = False

    # --------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.publisher.start()
        self.control.start()
        self.leases.start()
        self.heartbeat.start()
        self.failover.start()
        self.vital.start()
        stats = self.engine.stats()
        log.info("kvrelay worker %s ready: model %s on %s, weights %.1f MiB (quantization "
                 "%s%s), %d KV blocks of %d tokens; speculative decoding: %s; CPU threads: %s",
                 self.settings.worker_id, self.settings.served_model, self.engine.device,
                 stats.get("weight_bytes", 0) / 2**20, self._quantization(),
                 self._quantized_kernels(), stats["total_blocks"], stats["block_size"],
                 self._speculative(), self._cpu_threads())
        log.info("kvrelay worker tracing: %s", tracing.configure("kvrelay-worker"))

    def _thread_died(self, name: str) -> None:
        """A vital thread is gone: its jobs must move to live workers."""
        log.critical("the %s thread died", name)
        if self.on_thread_death is not None:
            self.on_thread_death(name)

    def _speculative(self) -> str:
        """The speculative setting for the ready line (the simulated engine never does)."""
        if self.settings.simulated:
            return "off (simulated engine)"
        return self.settings.speculative_summary

    def _quantization(self) -> str:
        """The weight quantization the engine chose (``auto`` decided at load)."""
        config = getattr(self.engine, "config", None)
        return str(getattr(config, "weight_quantization", self.settings.quantization))

    def _quantized_kernels(self) -> str:
        """Which kernels a CPU engine's quantized products run on, for the ready line."""
        if (self.settings.simulated or self._quantization() in ("none", "auto")
                or str(self.engine.device) != "cpu"):
            return ""
        from kvrelay_kernels.cpu_quantized_matmul import cpu_kernel_names  # imports torch

        return f" on {cpu_kernel_names()}"

    def _cpu_threads(self) -> str:
        """The torch thread settings for the ready line (a simulated worker has no torch)."""
        if self.settings.simulated:
            return "none (simulated engine)"
        from kvrelay_worker.cpu_threads import describe_cpu_threads  # imports torch

        return describe_cpu_threads(self.cpu_threads)

    def shutdown(self, grace: float | None = None) -> None:
        """Stop taking jobs; let running ones finish within ``grace``; hand back the rest."""
        grace = self.settings.shutdown_grace if grace is None else grace
        self.draining = True
        self.probes.draining()
        log.info("kvrelay worker draining: %d jobs held, grace %.0fs", len(self.jobs), grace)
        for job in self.jobs.jobs():
            if job.first_token_at is None and not job.prior.has_tokens:
                self.jobs.hand_back(job.job_id)
        deadline = time.monotonic() + grace
        while len(self.jobs) and time.monotonic() < deadline:
            time.sleep(0.05)
        for job in self.jobs.jobs():
            self.jobs.hand_back(job.job_id)
        deadline = time.monotonic() + 10.0
        while len(self.jobs) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.vital.stop()
        self.failover.stop()
        self.leases.stop()
        self.heartbeat.stop()
        self._release_own_queue()
        self.control.stop()
        self.service.stop()
        self.publisher.stop()
        tracing.flush()  # the process leaves without interpreter teardown (fast_exit)
        log.info("kvrelay worker stopped")

    def _release_own_queue(self) -> None:
        """Hand the jobs placed on this worker to the shared queue (its heartbeat is gone)."""
        try:
            self.orphans.move(self.settings.worker_id)
        except Exception as exc:  # live workers' watchdogs move them anyway
            log.warning("could not move this worker's queued jobs to the shared queue (%s)",
                        exc)

    def worker_info(self) -> WorkerInfo:
        return WorkerInfo(
            worker_id=self.settings.worker_id, model=self.settings.served_model,
            host=self.settings.host, pid=os.getpid(), device=str(self.engine.device),
            concurrency=self.settings.concurrency, started_at=self.started_at,
            updated_at=time.time(), jobs_running=len(self.jobs), draining=self.draining,
            stats=self.service.stats(), metrics_port=self.metrics_port,
            max_payload_bytes=self.settings.max_payload_bytes,
            prefix_filter=self.prefixes.advertised() if self.own_queue else "",
            adapters=self.adapters.advertised(), adapter_results=self.adapters.results(),
        )

    def _on_adapter(self, message: AdapterMessage) -> None:
        """An adapter load or unload for this worker's model (an unload naming no model
        is for every worker holding it): applied on the engine thread between steps, its
        outcome reported by the next heartbeat."""
        model = self.settings.served_model
        if message.model != model and not (message.model is None and message.action == "unload"):
            return
        self.service.call(lambda engine: self.adapters.apply(engine, message))

    # ------------------------------------------------------------------- jobs

    def reject(self, job_id: str | None, message: str) -> str:
        """Fail a delivered job as ``invalid_request`` without looking at its payload (one
        with no id is only counted)."""
        if not job_id:
            self.metrics.jobs.labels(outcome="rejected").inc()
            return "rejected"
        return self._end_unclaimed(job_id, ErrorCode.INVALID_REQUEST, message, "rejected")

    def drop_delivery(self, tag: str | None) -> None:
        """Remove the records of a message whose job ended here (``drop_delivery_records``)."""
        if tag:
            until_written(lambda: drop_delivery_records(self.store.redis, self.settings.keys,
                                                        tag),
                          "the records of a delivered message", self.health)

    def refuse_oversized(self, job_id: str | None, size: int) -> str:
        """Fail a job whose message was too large to parse (seen by ``payload_gate``)."""
        if not job_id:
            return "rejected"
        return self._end_unclaimed(
            job_id, ErrorCode.PAYLOAD_TOO_LARGE,
            f"the job's message is {size} bytes; this worker accepts payloads of at most "
            f"{self.settings.max_payload_bytes}", "rejected")

    def _end_unclaimed(self, job_id: str, code: str, message: str, outcome: str,
                       reply_to: str = "") -> str:
        """Fail a job this worker did not claim (it never ran) and count the outcome."""
        until_written(lambda: self.store.fail_unclaimed(job_id, code, message,
                                                        reply_to=reply_to),
                      f"the end of job {job_id}", self.health)
        self.metrics.jobs.labels(outcome=outcome).inc()
        return outcome

    def run_job(self, job_id: str | None, payload: object) -> str:
        """Run one delivered job to its end on this worker; returns what happened."""
        if not job_id:
            log.warning("ignoring a task without an id")
            return "ignored"
        picked_at = time.time()
        try:
            request, payload_json = decode_payload(payload, job_id, self.settings.served_model,
                                                   self.settings.max_payload_bytes)
        except JobRejected as rejected:
            return self._end_unclaimed(job_id, rejected.code, rejected.message, "rejected",
                                       reply_to_of(payload))
        if self.draining:
            until_written(lambda: self.requeue(job_id, payload_json),
                          f"the copy of job {job_id}", self.health)
            return Outcome.HANDBACK
        if request.deadline is not None and request.deadline <= time.time():
            return self._end_unclaimed(
                job_id, ErrorCode.DEADLINE_EXCEEDED,
                "the job's deadline passed before a worker picked it up", Outcome.DEADLINE,
                request.reply_to or "")
        # The run this claim starts; a claim resent after a lost reply finds it its own.
        run = run_id(self.settings.worker_id)
        digest = request_digest(request)
        claim = until_written(lambda: self.store.claim(job_id, payload_json, digest, run),
                              f"the claim of job {job_id}", self.health)
        if claim.status == "aborted":
            return self._end_unclaimed(job_id, ErrorCode.CANCELLED,
                                       "the job was cancelled before it started",
                                       Outcome.CANCELLED, request.reply_to or "")
        if claim.status == "reused":
            log.warning("refusing a copy of job %s: its request differs from the one the "
                        "job id belongs to", job_id)
            self.metrics.jobs.labels(outcome="rejected").inc()
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
        until_written(lambda: self.store.append_event(job_id, failed, fenced=run,
                                                      reply_to=request.reply_to or ""),
                      f"the end of job {job_id}", self.health)
        until_written(lambda: self.store.release_done(job_id, run),
                      f"the end of job {job_id}", self.health)
        self.metrics.jobs.labels(outcome=outcome).inc()
        return outcome

    def _run_claimed(self, job_id: str, request: GenerateRequest, payload_json: str,
                     attempt: int, prior: PriorProgress, run: str,
                     picked_at: float = 0.0) -> str:
        if prior.terminal:
            until_written(lambda: self.store.release_done(job_id, run),
                          f"the end of job {job_id}", self.health)
            return "duplicate"
        if prior.truncated:
            return self._fail_claimed(
                request, prior, ErrorCode.LOG_TRUNCATED,
                "the job's worker died and its replay log no longer starts at its first event "
                "(over KVRELAY_LOG_MAX_LEN or KVRELAY_LOG_MAX_BYTES): it cannot be continued",
                Outcome.FAILED, run)
        try:
            check_queue_wait(request, attempt, time.time(), self.settings.max_queue_wait,
                             lambda: self.store.picked_in_time(job_id))
            params = sampling_params_from(request, self.parsers)
            prompt_ids = prompt_ids_for(request, self.engine.tokenizer, self.engine.vocab_size,
                                        self.engine.max_model_len)
        except JobRejected as rejected:
            return self._fail_claimed(request, prior, rejected.code, rejected.message,
                                      "rejected", run)
        job = ActiveJob(job_id=job_id, request=request, payload_json=payload_json,
                        params=params, prompt_ids=prompt_ids, attempt=attempt, prior=prior,
                        run_id=run, next_seq=prior.next_seq, picked_at=picked_at,
                        cache_salt=self.settings.keys.cache_salt(request.cache_salt))
        with self.jobs.hold(job) as holds:
            if not holds:
                return Outcome.FENCED
            if attempt == 1 and request.enqueued_at:
                self.metrics.queue_time.observe(max(0.0, job.claimed_at - request.enqueued_at))
            started = Started(seq=0, worker=self.settings.worker_name, attempt=attempt,
                              prompt_tokens=len(prompt_ids), run=run)
            if self.settings.enable_prefix_caching:
                self.prefixes.note(request)
            # Started leaves with the next step's events while steps are short.
            self.service.submit(job, [EventItem(job, started)])
            self._wait_for_end(job)
        record_run(job, self.settings.worker_name)  # its spans, now that it is over
        return job.outcome or "unknown"

    def _wait_for_end(self, job: ActiveJob) -> None:
        """Wait for the job's end, but not past the death of the engine thread that would
        have ended it: then the job fails as ``internal`` and the Celery slot is freed."""
        while not job.done.wait(_LIVENESS_CHECK_S):
            if self.service.is_alive():
                continue
            log.error("the engine thread is gone; failing job %s", job.job_id)
            self.publisher.put([EventItem(job, Failed(
                seq=0, code=ErrorCode.INTERNAL, message="the worker's engine stopped"),
                Outcome.FAILED)])
            if not job.done.wait(_PUBLISH_GRACE_S):
                job.finish(Outcome.FAILED)  # the publisher is stuck too: stop waiting
            return


def simulated_engine(settings: WorkerSettings) -> ServedEngine:
    """The engine of ``KVRELAY_MODEL=simulated``: no weights, GPU-paced steps."""
    from kvrelay_worker.simulated.engine import SimulatedEngine
    from kvrelay_worker.simulated.step_time import StepTimeModel

    return SimulatedEngine(
        StepTimeModel(settings.simulated_step_ms, settings.simulated_token_ms),
        max_num_seqs=settings.max_num_seqs or max(settings.concurrency, 1),
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=settings.max_model_len)
