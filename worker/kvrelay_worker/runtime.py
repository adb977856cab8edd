"""Everything one worker process runs besides Celery itself, wired together.

Created once per process by the worker bootstep: loads the engine, then starts the
engine thread, the publisher thread, the lease keeper, the heartbeat, the failover watch
and the control listener, all over one Redis connection pool; a watch on the vital ones
(``vital_threads``) reports the death of any (the bootstep ends the process then). Task
threads enter through ``run_job`` (the per-job path is ``job_intake``); the jobs they
hold live in one registry (``OwnedJobs``); shutdown goes through ``shutdown`` (graceful:
finish within the grace period, hand the rest back).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvrelay.protocol import (
    AdapterMessage,
    WorkerInfo,
)
from kvrelay.tracing import switch as tracing
from kvrelay_worker.control_listener import ControlListener
from kvrelay_worker.engine.chat import template_text
from kvrelay_worker.engine.tools.model_parsers import ModelParsers
from kvrelay_worker.engine_service import EngineService
from kvrelay_worker.heartbeat import Heartbeat
from kvrelay_worker.intake.job_request import (
    prompt_ids_for,
)
from kvrelay_worker.job_intake import JobIntake
from kvrelay_worker.jobs.failover import Failover, Requeue
from kvrelay_worker.jobs.held_writes import until_written
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.jobs.lease_keeper import LeaseKeeper
from kvrelay_worker.jobs.orphan_queues import OrphanQueues
from kvrelay_worker.jobs.owned_jobs import OwnedJobs
from kvrelay_worker.jobs.publisher import Publisher
from kvrelay_worker.jobs.takeover_admission import TakeoverAdmission
from kvrelay_worker.jobs.takeover_throttle import TakeoverThrottle
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
        # How much of a dead worker's re-prefill this worker takes on at once.
        self.takeovers = TakeoverAdmission(self.store, TakeoverThrottle(
            settings.takeover_target_s, held=self.jobs.jobs,
            rate=lambda: float(self.service.stats().get("prefill_tokens_per_s") or 0.0)),
            prompt_tokens=lambda request: len(prompt_ids_for(
                request, self.engine.tokenizer, self.engine.vocab_size,
                self.engine.max_model_len)))
        self.intake = JobIntake(self)
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
    # Task threads enter here; the per-job path is ``job_intake``.

    def reject(self, job_id: str | None, message: str) -> str:
        return self.intake.reject(job_id, message)

    def drop_delivery(self, tag: str | None) -> None:
        self.intake.drop_delivery(tag)

    def refuse_oversized(self, job_id: str | None, size: int) -> str:
        return self.intake.refuse_oversized(job_id, size)

    def run_job(self, job_id: str | None, payload: object) -> str:
        return self.intake.run_job(job_id, payload)


def simulated_engine(settings: WorkerSettings) -> ServedEngine:
    """The engine of ``KVRELAY_MODEL=simulated``: no weights, GPU-paced steps."""
    from kvrelay_worker.simulated.engine import SimulatedEngine
    from kvrelay_worker.simulated.step_time import StepTimeModel

    return SimulatedEngine(
        StepTimeModel(settings.simulated_step_ms, settings.simulated_token_ms),
        max_num_seqs=settings.max_num_seqs or max(settings.concurrency, 1),
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=settings.max_model_len)
