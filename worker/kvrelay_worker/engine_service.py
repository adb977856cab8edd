"""The engine thread: the only thread that touches the ``LLMEngine``.

Task threads ``submit`` claimed jobs and anyone may ``abort`` one (or ``call`` a function
on the engine: adapter loads); all are commands on a queue that this thread applies
between steps. It loops ``step()`` while there is work,
turns each step's outputs into events and hands them to the publisher in one batch, so
it never waits on the network.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvrelay.protocol import (
    ErrorCode,
    Failed,
    Finished,
    PromptLogprob,
    Timings,
    TokenLogprob,
    Tokens,
    Usage,
)
from kvrelay_worker.device_loss import exit_for_device_loss
from kvrelay_worker.engine.errors import EngineInputError, PromptTooLongError
from kvrelay_worker.engine.outputs import ChoiceDelta, StepOutput
from kvrelay_worker.engine.runner.device_errors import is_sticky_device_error
from kvrelay_worker.engine.sample.token_bytes import token_bytes_for
from kvrelay_worker.jobs.active_job import ActiveJob, Outcome
from kvrelay_worker.jobs.publisher import DoneItem, EventItem, HandbackItem, Item, Publisher
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.served_adapters import ServedAdapters
from kvrelay_worker.served_engine import ServedEngine
from kvrelay_worker.wire_logprobs import wire_logprobs, wire_prompt_logprobs

log = logging.getLogger(__name__)
# While engine steps take less than this, a new job's Started waits for the next step's
# events (one publisher batch, not two); after a longer step it is sent at once, so a
# stream learns of its pickup at most about a second later than before (a queue wait has
# five seconds of grace in the SDK).
_ANNOUNCE_WITH_STEPS_UNDER_S = 1.0

_ABORT_FAILURES = {
    Outcome.CANCELLED: (ErrorCode.CANCELLED, "the job was cancelled"),
    Outcome.DEADLINE: (ErrorCode.DEADLINE_EXCEEDED, "the job's deadline passed while it ran"),
}


@dataclass
class _Add:
    job: ActiveJob
    # The job's ``Started``: sent with the next step's events (one publisher batch for
    # both), or at once while steps are long (``_ANNOUNCE_WITH_STEPS_UNDER_S``).
    announce: list[Item]


@dataclass
class _Abort:
    job_id: str
    reason: str


@dataclass
class _Call:
    # Run on the engine thread between steps (an adapter's load or unload).
    fn: Callable[[ServedEngine], None]


class EngineService:
    """Owns the engine and the one thread that runs it.

    The engine is also *built* on that thread: on CPU, torch's OpenMP runtime keeps a team
    of helper threads per thread that computes, and spins them less (waking them late)
    once a process has more of them than cores. Building the model on the main thread
    and stepping it on another made every CPU step markedly slower.
    """

    def __init__(self, make_engine: Callable[[], ServedEngine], publisher: Publisher,
                 metrics: WorkerMetrics,
                 on_device_lost: Callable[[BaseException], None] = exit_for_device_loss,
                 adapters: ServedAdapters | None = None) -> None:
        self._make_engine = make_engine
        # The LoRA adapters jobs may name (None: none; every job naming one is refused).
        self.adapters = adapters
        # Called on the engine thread when a step hits a sticky device error; the default
        # ends the process (``device_loss.py``).
        self._on_device_lost = on_device_lost
        self._engine: ServedEngine | None = None
        self.publisher = publisher
        self.metrics = metrics
        self._commands: queue.SimpleQueue[_Add | _Abort | _Call | None] = queue.SimpleQueue()
        self._jobs: dict[str, ActiveJob] = {}
        # Events of jobs added since the last step, sent ahead of its events; and how long
        # that step took (a long one sends them at once instead).
        self._announce: list[Item] = []
        self._last_step_s = 0.0
        self._thread = threading.Thread(target=self._run, name="kvrelay-engine", daemon=True)
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._stats: dict[str, Any] = {}
        self._stats_lock = threading.Lock()

    @property
    def engine(self) -> ServedEngine:
        if self._engine is None:
            raise RuntimeError("the engine is not started")
        return self._engine

    # ------------------------------------------------------------ any thread

    def start(self) -> ServedEngine:
        """Build the engine on its thread and start stepping; returns it once loaded."""
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error
        return self.engine

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._commands.put(None)
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        """Whether the engine thread still runs (a job submitted to a dead one never ends)."""
        return self._thread.is_alive()

    def submit(self, job: ActiveJob, announce: list[Item] | None = None) -> None:
        """Add ``job``; ``announce`` (its ``Started``) leaves with the next step's events
        while steps are short, so a job's arrival costs Redis no batch of its own."""
        self._commands.put(_Add(job, announce or []))

    def abort(self, job_id: str, reason: str) -> None:
        self._commands.put(_Abort(job_id, reason))

    def call(self, fn: Callable[[ServedEngine], None]) -> None:
        """Run ``fn(engine)`` on the engine thread between two steps; it must not raise."""
        self._commands.put(_Call(fn))

    def stats(self) -> dict[str, Any]:
        with self._stats_lock:
            return dict(self._stats)

    # --------------------------------------------------------- engine thread

    def _run(self) -> None:
        try:
            self._engine = self._make_engine()
            # An engine built elsewhere (passed in) steps here: this thread needs its device.
            # A simulated engine's device is a plain name, and its process has no torch.
            if not isinstance(self._engine.device, str):
                from kvrelay_worker.engine.runner.device import bind_device

                bind_device(self._engine.device)
            self._refresh_stats()
        except BaseException as exc:
            self._startup_error = exc
            return
        finally:
            self._ready.set()
        while not self._stopping.is_set():
            idle = not self.engine.has_unfinished_requests()
            self._apply_commands(block=idle)
            self._expire_deadlines()
            if self.engine.has_unfinished_requests():
                started = time.monotonic()
                try:
                    outputs = self.engine.step()
                except Exception as exc:
                    if is_sticky_device_error(exc):
                        self._on_device_lost(exc)  # its jobs must move, not fail
                        return
                    # The engine fails a request that breaks a step by itself; reaching
                    # here means the step failed outside any request (scheduling).
                    log.exception("engine step failed; failing the jobs it held")
                    self._fail_all(ErrorCode.INTERNAL, "the engine failed while running the job")
                    continue
                self._last_step_s = time.monotonic() - started
                self._publish(outputs)
            self._refresh_stats()
            self._mark_progress()

    def _mark_progress(self) -> None:
        """Every job the engine holds moved with this loop: it ran, or waits its turn in
        the engine (queued, preempted), which the scheduler decides. A step that never
        returns marks nothing, so the leases of its jobs go (``lease_keeper``)."""
        now = time.monotonic()
        for job in self._jobs.values():
            job.progress_at = now

    def _apply_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.05) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while command is not None:
            if isinstance(command, _Add):
                self._add(command.job, command.announce)
            elif isinstance(command, _Call):
                command.fn(self.engine)
            else:
                self._abort(command.job_id, command.reason)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _add(self, job: ActiveJob, announce: list[Item]) -> None:
        earlier = self._jobs.pop(job.job_id, None)
        if earlier is not None:
            # A run of this job that this worker claimed again (it stalled past its lease):
            # the earlier run was fenced and is done, but its request may still be in the
            # engine under the same id. Drop it unreported, or its ``abort`` would end the
            # new run's stream; a run that did not stop in time ends as fenced here, or
            # its task thread would wait for it forever.
            self.engine.abort_request(job.job_id, report=False)
            if not earlier.done.is_set():
                earlier.finish(Outcome.FENCED)
        if self._last_step_s >= _ANNOUNCE_WITH_STEPS_UNDER_S:
            self._send(announce)  # a long step must not hold back the news of a pickup
            announce = []
        plan = job.replay
        lora = job.request.lora
        refusal = None if lora is None else (
            self.adapters.refusal(lora) if self.adapters is not None
            else "this worker serves no LoRA adapters")
        if refusal is not None:
            self._send([*announce, EventItem(job, Failed(
                seq=0, code=ErrorCode.INVALID_REQUEST, message=f"lora: {refusal}"),
                Outcome.FAILED)])
            return
        # Only a job that names an adapter passes one: an engine without LoRA support
        # (the simulated one) takes every other job as before.
        adapter: dict[str, str] = {} if lora is None else {"lora": lora}
        try:
            self.engine.add_request(
                job.job_id, job.prompt_ids, job.params,
                priority=job.request.priority, cache_salt=job.cache_salt,
                prior_outputs=plan.outputs, prior_texts=plan.texts,
                prior_finish_reasons=plan.finish_reasons,
                prior_reasoning=plan.reasoning, prior_tool_calls=plan.tool_calls, **adapter,
            )
        except EngineInputError as exc:
            code = (ErrorCode.PROMPT_TOO_LONG if isinstance(exc, PromptTooLongError)
                    else ErrorCode.INVALID_REQUEST)
            self._send([*announce, EventItem(job, Failed(seq=0, code=code, message=str(exc)),
                                             Outcome.FAILED)])
            return
        except Exception as exc:
            log.exception("could not add job %s", job.job_id)
            self._send([*announce, EventItem(
                job, Failed(seq=0, code=ErrorCode.INTERNAL, message=str(exc)), Outcome.FAILED)])
            return
        self._announce.extend(announce)
        self._jobs[job.job_id] = job
        self.metrics.prompt_tokens.inc(len(job.prompt_ids))

    def _abort(self, job_id: str, reason: str) -> None:
        job = self._jobs.get(job_id)
        if job is None or job.abort_reason is not None:
            return
        job.abort_reason = reason
        self.engine.abort_request(job_id)

    def _expire_deadlines(self) -> None:
        now = time.time()
        for job in self._jobs.values():  # _abort leaves _jobs as it is
            if job.deadline is not None and job.deadline <= now and job.abort_reason is None:
                self._abort(job.job_id, Outcome.DEADLINE)

    def _fail_all(self, code: str, message: str) -> None:
        items: list[Item] = self._take_announce()
        for job in list(self._jobs.values()):
            try:
                self.engine.abort_request(job.job_id)
            except Exception:
                log.exception("abort of %s failed during recovery", job.job_id)
            items.append(EventItem(job, Failed(seq=0, code=code, message=message),
                                   Outcome.FAILED))
        self._jobs.clear()
        try:
            self.engine.step()  # drain the aborts
        except Exception:
            log.exception("engine could not drain after a failure")
        self._send(items)

    def _take_announce(self) -> list[Item]:
        """The announcements of the jobs added since the last step (sent ahead of it)."""
        items, self._announce = self._announce, []
        return items

    def _publish(self, outputs: list[StepOutput]) -> None:
        items: list[Item] = self._take_announce()
        for out in outputs:
            job = self._jobs.get(out.request_id)
            if job is None:
                continue
            if out.error is not None:  # this request broke a step; the others went on
                items.append(EventItem(job, Failed(seq=0, code=ErrorCode.INTERNAL,
                                                   message=str(out.error)), Outcome.FAILED))
                del self._jobs[job.job_id]
                continue
            for delta in out.deltas:
                if delta.index in job.replay.published:
                    continue  # a best_of winner an earlier attempt published whole
                if delta.token_ids or delta.text or delta.reasoning or delta.tool_calls or (
                        delta.finish_reason and delta.finish_reason != "abort"):
                    items.append(EventItem(job, self._tokens_event(delta)))
            if out.finished:
                items.extend(self._end(job, out))
                del self._jobs[job.job_id]
        self._send(items)

    def _end(self, job: ActiveJob, out: StepOutput) -> list[Item]:
        reason = job.abort_reason
        if reason is None:
            return [EventItem(job, self._finished_event(job, out), Outcome.FINISHED)]
        if reason == Outcome.HANDBACK:
            return [HandbackItem(job)]
        if reason == Outcome.FENCED:
            return [DoneItem(job, Outcome.FENCED)]
        code, message = _ABORT_FAILURES.get(reason, (ErrorCode.INTERNAL, reason))
        return [EventItem(job, Failed(seq=0, code=code, message=message), reason)]

    def _tokens_event(self, delta: ChoiceDelta) -> Tokens:
        logprobs: list[TokenLogprob] | None = None
        prompt_logprobs: list[PromptLogprob | None] | None = None
        if delta.logprobs is not None or delta.prompt_logprobs is not None:
            # Each token's bytes, from the tokenizer's vocabulary (only with logprobs).
            as_bytes = token_bytes_for(self.engine.tokenizer)
            if delta.logprobs is not None:
                logprobs = wire_logprobs(delta.logprobs, as_bytes)
            if delta.prompt_logprobs is not None:
                prompt_logprobs = wire_prompt_logprobs(delta.prompt_logprobs, as_bytes)
        return Tokens(
            seq=0, token_ids=list(delta.token_ids), text=delta.text, index=delta.index,
            logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            finish_reason=delta.finish_reason if delta.finish_reason != "abort" else None,
            cumulative_logprob=delta.cumulative_logprob,
            beam_score=delta.beam_score,
            reasoning=delta.reasoning or None,
            tool_calls=delta.tool_calls or None,
        )

    def _finished_event(self, job: ActiveJob, out: StepOutput) -> Finished:
        assert out.output is not None
        published = job.replay.published
        reasons = [published.get(c.index) or c.finish_reason or "stop"
                   for c in out.output.choices]
        now = time.time()
        first = job.first_token_at or now
        return Finished(
            seq=0,
            finish_reason=reasons[0],
            finish_reasons=reasons,
            usage=Usage(prompt_tokens=out.num_prompt_tokens,
                        completion_tokens=out.output.num_generated_tokens,
                        cached_tokens=out.num_cached_tokens),
            timings=Timings(queue=max(0.0, job.claimed_at - job.enqueued_at),
                            ttft=max(0.0, first - job.enqueued_at),
                            decode=max(0.0, now - first),
                            total=max(0.0, now - job.enqueued_at)),
        )

    def _send(self, items: list[Item]) -> None:
        self.publisher.put(items)

    def _refresh_stats(self) -> None:
        stats = self.engine.stats()
        stats["jobs"] = len(self._jobs)
        with self._stats_lock:
            self._stats = stats

