"""The engine: ``add_request``, ``abort_request``, ``step()``; the only door the worker uses.

Single-threaded by design: one thread calls these methods (the worker's engine thread
serialises requests from task threads into it). Each ``step()`` schedules a batch, runs
the model once, samples one token for every sequence that reached its end, and reports
what each touched request produced.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

from kvrelay.protocol import ToolCallDelta
from kvrelay_kernels.backend import cpu_kernels_allowed
from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
from kvrelay_worker.engine.beam.beam_group import (
    BeamGroup,
    advance_beams,
    beam_candidates,
    beam_config_of,
)
from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.engine_model import build_model_for, resolve_quantization
from kvrelay_worker.engine.engine_parts import build_engine_parts
from kvrelay_worker.engine.engine_stats import engine_stats
from kvrelay_worker.engine.errors import (
    LoraAdapterError,
    LoraNotLoadedError,
    RequestFailedError,
)
from kvrelay_worker.engine.kv.block_copy import copy_blocks
from kvrelay_worker.engine.kv.kv_swap import copy_to_device, copy_to_host
from kvrelay_worker.engine.kv.max_model_len import default_max_len
from kvrelay_worker.engine.lora.adapter import LoraAdapter, LoraInfo
from kvrelay_worker.engine.outputs import StepOutput
from kvrelay_worker.engine.prefill_rate import PrefillRate
from kvrelay_worker.engine.prompt import Prompt
from kvrelay_worker.engine.request_state import RequestState
from kvrelay_worker.engine.runner.device import bind_device
from kvrelay_worker.engine.runner.device_errors import is_sticky_device_error
from kvrelay_worker.engine.runner.prompt_scoring import PromptScores
from kvrelay_worker.engine.sample.sampler import SamplerOutput
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.sched.scheduler_output import BatchLayout, ScheduledSequence
from kvrelay_worker.engine.sched.sequence import Sequence, SequenceStatus
from kvrelay_worker.models.decoder import CausalLM

log = logging.getLogger(__name__)


class LLMEngine:
    """Continuous-batching inference over a paged KV cache for one model."""

    def __init__(self, config: EngineConfig, *, progress: bool = False) -> None:
        from kvrelay_worker.loading import load_model_source

        bind_device(config.torch_device)  # before any weight, stream or graph exists
        # A GGUF the engine will keep quantized is read as it is, never converted to floats.
        files = load_model_source(config.model, progress=progress,
                                  keep_gguf=resolve_quantization(config, "gguf") == "gguf")
        config = dataclasses.replace(
            config, quantization=resolve_quantization(config, files.source.kind))
        max_len = default_max_len(config, files.config.max_position_embeddings)
        model = build_model_for(config, files, max_len)
        self._setup(config, model, files.tokenizer, model_id=files.name)

    @classmethod
    def from_model(cls, config: EngineConfig, model: CausalLM, tokenizer: Any,
                   model_id: str = "custom", *,
                   draft_model: CausalLM | None = None) -> LLMEngine:
        """An engine around an already built model (random-weight benchmarks, tests);
        ``draft_model`` is the draft when ``config.speculative`` is ``draft:...``."""
        engine = cls.__new__(cls)
        engine._setup(config, model, tokenizer, model_id, draft_model)
        return engine

    def _setup(self, config: EngineConfig, model: CausalLM, tokenizer: Any,
               model_id: str, draft_model: CausalLM | None = None) -> None:
        bind_device(config.torch_device)
        if config.torch_device.type == "cpu" and cpu_kernels_allowed():
            # The first start on a machine compiles the C++ kernels (a minute on two busy
            # cores): here it delays the ready line, not a first job past its stream timeout.
            load_cpu_kernels()
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.device = config.torch_device
        self.vocab_size = model.config.vocab_size
        parts = build_engine_parts(config, model, tokenizer, model_id, draft_model)
        self.eos_token_ids = parts.eos_token_ids
        self.runner = parts.runner
        self.step_timer = parts.step_timer
        self.weight_bytes = parts.weight_bytes
        self.max_model_len = parts.max_model_len
        self.kv = parts.kv
        self.host_kv_caches = parts.host_kv_caches
        self.scheduler = parts.scheduler
        self.sampler = parts.sampler
        self.sampling_batches = parts.sampling_batches
        self.speculator = parts.speculator
        self.inputs = parts.inputs
        self.loras = parts.loras
        self.requests: dict[str, RequestState] = {}
        self.beam_groups: dict[str, BeamGroup] = {}
        self._pending: list[StepOutput] = []
        self.num_steps = 0
        # Prompt tokens per second of the latest prefill steps (the takeover throttle's).
        self.prefill_rate = PrefillRate()

    # ------------------------------------------------------------------ requests

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None,
                    prior_outputs: Seq[Seq[int]] | None = None,
                    prior_texts: Seq[str] | None = None,
                    prior_finish_reasons: Seq[str | None] | None = None,
                    prior_reasoning: Seq[str] | None = None,
                    prior_tool_calls: Seq[Seq[ToolCallDelta]] | None = None,
                    lora: str | None = None) -> list[int]:
        """Validate a request and queue it; return its prompt token ids.

        ``prior_*`` resume a request an earlier attempt started (failover): per choice,
        the tokens and text it already reported, and a finish reason for choices that had
        already ended (with output parsers, the reasoning and tool-call pieces it sent).
        Generation continues after them; they are never reported again.
        ``lora`` names a loaded LoRA adapter (``add_lora``) the request runs with.
        Bad input raises before anything is queued, so the engine is left as it was.
        """
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        state = self.inputs.process(request_id, prompt, params, priority=priority,
                                    cache_salt=cache_salt, prior_outputs=prior_outputs,
                                    prior_texts=prior_texts,
                                    prior_finish_reasons=prior_finish_reasons,
                                    prior_reasoning=prior_reasoning,
                                    prior_tool_calls=prior_tool_calls,
                                    lora=self._adapter(lora))
        self._queue(state)
        return state.prompt_token_ids

    def _queue(self, state: RequestState) -> None:
        """Hand the unfinished choices to the scheduler (or report a request already done).

        Choices 2..n wait for the first one's prompt, so they find its blocks cached.
        """
        first: Sequence | None = None
        for choice in state.choices:
            if choice.finish_reason is not None:
                continue
            seq = choice.seq
            if first is None:
                first = seq
            elif self.config.enable_prefix_caching:
                seq.waits_for = first
            self.scheduler.add(seq)
        if state.finished:
            self._pending.append(state.step_output())
        else:
            self.requests[state.request_id] = state
            first = state.choices[0].seq
            if first.params.is_beam_search:
                config = beam_config_of(first, self.eos_token_ids, self.max_model_len)
                self.beam_groups[state.request_id] = BeamGroup(state, config)

    def abort_request(self, request_id: str, *, report: bool = True) -> bool:
        """Stop a request now and free its blocks; reported as ``abort`` by the next step
        (``report=False``: never reported, for a caller that reuses the id at once)."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return False
        self.beam_groups.pop(request_id, None)
        for choice in state.choices:
            if choice.finish_reason is None:
                self.scheduler.finish(choice.seq, SequenceStatus.FINISHED_ABORTED)
                choice.finish_reason = "abort"
        if report:
            self._pending.append(state.step_output())
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._pending)

    # ---------------------------------------------------------------------- step

    def step(self) -> list[StepOutput]:
        """Schedule, execute, sample, update; report every request the step touched.

        When the step raises, it is retried on halves of the batch until the requests
        that make it fail are alone; those fail (``StepOutput.error``), the rest go on.
        A sticky device error (``runner/device_errors.py``) is raised instead: it is no
        request's fault, and every later call on the device would fail the same way.
        """
        outputs, self._pending = self._pending, []
        self.step_timer.start()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running,
                                   self.scheduler.prefill_estimate())
        sched = self.scheduler.schedule()
        # Before the forward pass, which may write the blocks a swap-out just freed.
        copy_to_host(self.runner.kv_caches, self.host_kv_caches, sched.swap_out)
        copy_to_device(self.host_kv_caches, self.runner.kv_caches, sched.swap_in)
        copy_blocks(self.runner.kv_caches, sched.copies)  # copy-on-write of forked beams
        if sched.is_empty:
            return outputs
        if self.loras is not None:  # every adapter the step runs gets its device slot
            self.loras.activate(self.scheduler.running)
        self.num_steps += 1
        touched: dict[str, RequestState] = {}
        try:
            sampled, scores = self._execute_and_sample(sched.layout)
        except Exception as exc:
            if is_sticky_device_error(exc):
                raise  # the device is lost for every request: no part of the batch can run
            log.warning("engine step failed (%r); retrying its batch in parts to find "
                        "the request that makes it fail", exc)
            self._isolate_failure(sched.scheduled, touched)
        else:
            self._update(sched.layout, sampled, touched, scores)
            # The whole step, as a decoding stream waits for it: its device work done too
            # (a step where no row samples read nothing back).
            ms = self.step_timer.elapsed_ms()
            self.scheduler.observe_step(sched, ms)
            self.prefill_rate.observe(sched.shape.prefill_tokens, ms / 1000.0)
            if self.speculator is not None:
                self.speculator.observe_step(sched.num_batched_tokens, ms)
        for request_id, state in touched.items():
            outputs.append(state.step_output())
            if state.finished:
                del self.requests[request_id]
                self.beam_groups.pop(request_id, None)
        return outputs

    def _execute_and_sample(self, layout: BatchLayout
                            ) -> tuple[SamplerOutput | None, list[PromptScores]]:
        """Run the model on ``layout``'s batch and sample its rows; changes no sequence.

        A row after a draft samples as its output position would without speculation
        (``spec/verification.py``); a beam's row also gives its best candidates. Prompt
        chunks whose log-probabilities are asked come back scored.
        """
        scores: list[PromptScores] = []
        if layout.prompt_spans:
            logits, scores = self.runner.execute_scoring(layout)
        else:
            logits = self.runner.execute(layout.scheduled, layout=layout)
        if not layout.num_rows:
            return None, scores
        batch = self.sampling_batches.build(layout.row_seqs, layout.row_offsets)
        result = self.sampler(logits, batch)
        if layout.beam_rows:  # what beam search ranks: log_softmax of the raw logits
            per_beam = max(self.beam_groups[layout.row_seqs[row].request_id]
                           .candidates_per_beam for row in layout.beam_rows)
            result.beam_log_probs, result.beam_token_ids = beam_candidates(
                logits[layout.beam_rows], per_beam)
        return result, scores

    def _update(self, layout: BatchLayout, result: SamplerOutput | None,
                touched: dict[str, RequestState], scores: Seq[PromptScores] = ()) -> None:
        """Let the scheduler apply the step, then report each sequence's new tokens (and
        keep its prompt's scores; a ``max_tokens`` 0 request ends with its prompt)."""
        update = self.scheduler.update_from_output(layout, result.token_ids if result else [])
        for chunk in scores:
            prompt_logprobs = self.requests[chunk.seq.request_id].prompt_logprobs
            if prompt_logprobs is not None:
                prompt_logprobs.record(chunk)
        for item in layout.prompt_only:
            state = self.requests[item.seq.request_id]
            state.choices[item.seq.choice_index].finish_reason = item.seq.status.value
            touched[item.seq.request_id] = state
        if layout.beam_rows:
            assert result is not None
            for group in advance_beams(self.beam_groups, layout, result, self.scheduler,
                                       self.tokenizer):
                touched[group.state.request_id] = group.state
        failures: dict[str, Exception] = {}
        for item, row, n, accepted in zip(layout.sampling, layout.first_rows,
                                          update.appended, update.accepted, strict=True):
            seq = item.seq
            if item.drafts and self.speculator is not None:
                self.speculator.verified(seq, len(item.drafts), accepted)
            if not n:
                continue  # a beam: its group reports the request
            # A scheduled sequence's request is always here: requests leave only once
            # every choice is finished, and a finished sequence is never scheduled.
            state = self.requests[seq.request_id]
            assert result is not None
            for j in range(row, row + n):  # accepted drafts, then its own token
                state.choices[seq.choice_index].record_token(result, j)
            touched[seq.request_id] = state
            if seq.detok_error is not None:
                failures.setdefault(seq.request_id, seq.detok_error)
        for request_id, exc in failures.items():
            self._fail_request(request_id, exc, touched)

    def _isolate_failure(self, scheduled: Seq[ScheduledSequence],
                         touched: dict[str, RequestState]) -> None:
        """Run ``scheduled`` in halves until each failure is down to one sequence.

        Nothing of a failed attempt is kept (``update`` never ran), so a part that
        succeeds is applied like a normal step and a lone sequence that fails ends its
        request alone.
        """
        parts = [list(scheduled)]
        while parts:
            part = [item for item in parts.pop() if not item.seq.is_finished]
            if not part:
                continue
            layout = BatchLayout.of(part)
            try:
                sampled, scores = self._execute_and_sample(layout)
            except Exception as exc:
                if is_sticky_device_error(exc):
                    raise
                if len(part) == 1:
                    self._fail_request(part[0].seq.request_id, exc, touched)
                else:
                    middle = len(part) // 2
                    parts += [part[middle:], part[:middle]]
                continue
            self._update(layout, sampled, touched, scores)

    def _fail_request(self, request_id: str, exc: Exception,
                      touched: dict[str, RequestState]) -> None:
        log.error("request %s makes the engine step fail; failing it alone",
                  request_id, exc_info=exc)
        state = self.requests[request_id]
        self.beam_groups.pop(request_id, None)
        for choice in state.choices:
            if choice.finish_reason is None:
                self.scheduler.finish(choice.seq, SequenceStatus.FINISHED_ABORTED)
                choice.finish_reason = SequenceStatus.FINISHED_ABORTED.value
        error = RequestFailedError(f"the engine step failed on this request: {exc!r}")
        error.__cause__ = exc
        state.error = error
        touched[request_id] = state

    # ------------------------------------------------------------------ adapters

    def add_lora(self, name: str, path: str | Path) -> LoraInfo:
        """Load the PEFT LoRA folder ``path`` as adapter ``name`` (between steps); loading
        a name again replaces it for later requests. Raises ``LoraAdapterError`` when
        LoRA is off (``max_loras`` 0) or the folder cannot be served on this model."""
        if self.loras is None:
            raise LoraAdapterError("LoRA adapters are off on this engine: start it with "
                                   "max_loras of 1 or more")
        return self.loras.add(name, path)

    def remove_lora(self, name: str) -> bool:
        """Stop accepting requests for ``name``; False when it was not loaded. Requests
        already accepted finish with it, then its memory is freed."""
        return self.loras.remove(name) if self.loras is not None else False

    def list_loras(self) -> list[LoraInfo]:
        """The adapters requests may name, in the order they were loaded."""
        return self.loras.loaded() if self.loras is not None else []

    def _adapter(self, name: str | None) -> LoraAdapter | None:
        if name is None:
            return None
        if self.loras is None:
            raise LoraNotLoadedError(f"LoRA adapter {name!r} asked for, but LoRA adapters "
                                     "are off on this engine")
        return self.loras.get(name)

    # --------------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        stats = engine_stats(self.scheduler, self.kv, self.speculator,
                             requests=len(self.requests), steps=self.num_steps,
                             weight_bytes=self.weight_bytes, max_model_len=self.max_model_len,
                             block_size=self.config.block_size)
        if self.loras is not None:
            stats |= self.loras.stats()
        stats["prefill_tokens_per_s"] = self.prefill_rate.tokens_per_s()
        return stats
