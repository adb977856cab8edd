"""The engine: ``add_request``, ``abort_request``, ``step()``; the only door the worker uses.

Single-threaded by design: one thread calls these methods (the worker's engine thread
serialises requests from task threads into it). Each ``step()`` schedules a batch, runs
the model once, samples one token for every sequence that reached its end, and reports
what each touched request produced.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import torch

from kvrelay_worker.engine.beam_group import (
    BeamGroup,
    advance_beams,
    beam_candidates,
    beam_config_of,
)
from kvrelay_worker.engine.block_copy import copy_blocks
from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.detokenizer import IncrementalDetokenizer
from kvrelay_worker.engine.device import bind_device
from kvrelay_worker.engine.device_errors import is_sticky_device_error
from kvrelay_worker.engine.errors import (
    EngineConfigError,
    InvalidPromptError,
    RequestFailedError,
    SamplingParamsError,
)
from kvrelay_worker.engine.grammar import GrammarCompiler
from kvrelay_worker.engine.kv_cache import KVCacheManager
from kvrelay_worker.engine.kv_sizing import decide_num_blocks, decide_num_swap_blocks
from kvrelay_worker.engine.kv_swap import allocate_host_kv, copy_to_device, copy_to_host
from kvrelay_worker.engine.model_runner import ModelRunner, kv_bytes_per_block
from kvrelay_worker.engine.outputs import StepOutput
from kvrelay_worker.engine.preemption import (
    PreemptionPolicy,
    SwapCostModel,
    preemption_mode,
)
from kvrelay_worker.engine.prefill_pacing import PrefillPacer
from kvrelay_worker.engine.prior_choices import PriorChoices
from kvrelay_worker.engine.prompt import Prompt, prompt_token_ids
from kvrelay_worker.engine.request_state import ChoiceState, RequestState
from kvrelay_worker.engine.sampler import Sampler, SamplerOutput
from kvrelay_worker.engine.sampling_batch import SamplingBatchBuilder, build_sampling_batch
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.scheduler import ScheduledSequence, Scheduler
from kvrelay_worker.engine.scheduler_output import BatchLayout
from kvrelay_worker.engine.sequence import Sequence, SequenceStatus
from kvrelay_worker.engine.speculative.speculator import Speculator
from kvrelay_worker.engine.step_timer import StepTimer
from kvrelay_worker.engine.stop_conditions import StopConditions
from kvrelay_worker.engine.swap_space import SwapSpace
from kvrelay_worker.models.decoder import CausalLM
from kvrelay_worker.models.factory import build_model
from kvrelay_worker.models.quantize_model import quantize_model, weight_bytes

if TYPE_CHECKING:
    from kvrelay_worker.loading import LoadedModelFiles

log = logging.getLogger(__name__)


def eos_token_ids_of(model: CausalLM, tokenizer: Any) -> tuple[int, ...]:
    ids = set(model.config.eos_token_ids)
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(tok_eos, int):
        ids.add(tok_eos)
    return tuple(sorted(ids))


class LLMEngine:
    """Continuous-batching inference over a paged KV cache for one model."""

    def __init__(self, config: EngineConfig, *, progress: bool = False) -> None:
        from kvrelay_worker.loading import load_model_source

        bind_device(config.torch_device)  # before any weight, stream or graph exists
        files = load_model_source(config.model, progress=progress)
        max_len = self._default_max_len(config, files.config.max_position_embeddings)
        model = self.build_model_for(config, files, max_len)
        self._setup(config, model, files.tokenizer, model_id=files.name)

    @staticmethod
    def build_model_for(config: EngineConfig, files: LoadedModelFiles, max_len: int
                        ) -> CausalLM:
        """The model with float weights, or quantized as ``config.quantization`` says."""
        method = config.weight_quantization
        if method == "gguf":
            return LLMEngine._build_gguf_model(config, files, max_len)
        model = build_model(files.config, files.weights(), config.torch_dtype,
                            config.torch_device, max_position=max_len)
        if method in ("int8", "int4"):
            quantize_model(model, method, config.quantization_group_size)
        log.info("model weights: %.1f MiB (%s)", weight_bytes(model) / 2**20,
                 "float" if method == "none" else method)
        return model

    @staticmethod
    def _build_gguf_model(config: EngineConfig, files: LoadedModelFiles,
                          max_len: int) -> CausalLM:
        """Read the GGUF file itself, its quantized blocks kept (``gguf_quantized_model``)."""
        from kvrelay_worker.loading import GGUFCheckpoint, build_gguf_quantized_model

        if files.source.kind != "gguf":
            raise EngineConfigError(
                f"quantization='gguf' keeps a GGUF file's quantized blocks, but "
                f"{files.name!r} is a Hugging Face folder; use int8 or int4 to quantize it"
            )
        model, formats = build_gguf_quantized_model(
            GGUFCheckpoint(files.source.path), config.torch_dtype, config.torch_device, max_len)
        counts: dict[str, int] = {}
        for fmt in formats.values():
            key = f"{fmt.gguf_type} {fmt.how}"
            counts[key] = counts.get(key, 0) + 1
        log.info("model weights: %.1f MiB kept from GGUF (%s)", weight_bytes(model) / 2**20,
                 ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
        return model

    @classmethod
    def from_model(cls, config: EngineConfig, model: CausalLM, tokenizer: Any,
                   model_id: str = "custom", *,
                   draft_model: CausalLM | None = None) -> LLMEngine:
        """An engine around an already built model (random-weight benchmarks, tests);
        ``draft_model`` is the draft when ``config.speculative`` is ``draft:...``."""
        engine = cls.__new__(cls)
        engine._setup(config, model, tokenizer, model_id, draft_model)
        return engine

    @staticmethod
    def _default_max_len(config: EngineConfig, model_max: int) -> int:
        if config.max_model_len is not None and config.max_model_len > model_max:
            raise EngineConfigError(
                f"max_model_len {config.max_model_len} exceeds the model's "
                f"{model_max} positions"
            )
        return config.max_model_len or model_max

    @staticmethod
    def _tokens_held(config: EngineConfig, max_len: int, window: int | None) -> int:
        """The most KV slots one sequence can hold at once: the pool must fit that.

        Normally its whole length; when every layer has a window and prompts are
        chunked, only the window plus one step's chunk (and a block of slack on each
        side), since blocks behind the window are released as it advances.
        """
        if window is None or not config.enable_chunked_prefill:
            return max_len
        bs = config.block_size
        windowed = (-(-(window - 1 + config.max_num_batched_tokens) // bs) + 1) * bs
        return min(max_len, windowed)

    def _setup(self, config: EngineConfig, model: CausalLM, tokenizer: Any,
               model_id: str, draft_model: CausalLM | None = None) -> None:
        bind_device(config.torch_device)
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.device = config.torch_device
        self.vocab_size = model.config.vocab_size
        self.eos_token_ids = eos_token_ids_of(model, tokenizer)
        self.grammars = GrammarCompiler(tokenizer, self.vocab_size, self.eos_token_ids)
        self.runner = ModelRunner(model, config.block_size, self.device, config.torch_dtype,
                                  config.torch_kv_cache_dtype)
        self.step_timer = StepTimer.for_device(self.device)
        self.weight_bytes = weight_bytes(model)
        draft_model = self._draft_weights(config, model, draft_model)
        draft_per_block = (0 if draft_model is None else kv_bytes_per_block(
            draft_model, config.block_size, config.torch_kv_cache_dtype))
        num_blocks = decide_num_blocks(config, self.runner, draft_per_block)
        capacity = num_blocks * config.block_size
        max_len = self._default_max_len(config, model.config.max_position_embeddings)
        if capacity < self._tokens_held(config, max_len, model.config.kv_window):
            if config.max_model_len is not None:
                raise EngineConfigError(
                    f"the KV pool holds {capacity} tokens ({num_blocks} blocks), fewer than "
                    f"max_model_len={max_len}; give it more memory or lower max_model_len"
                )
            log.warning("max_model_len lowered from %d to the KV pool's %d tokens",
                        max_len, capacity)
            max_len = capacity
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_len:
            # Without chunking a prompt (or a preempted sequence's recompute) runs in one
            # step; a longer one could never be scheduled and would wait forever.
            if config.max_model_len is not None:
                raise EngineConfigError(
                    f"with chunked prefill off, max_num_batched_tokens "
                    f"({config.max_num_batched_tokens}) must be at least max_model_len "
                    f"({max_len}); raise it, lower max_model_len or enable chunked prefill"
                )
            log.warning("max_model_len lowered from %d to max_num_batched_tokens=%d "
                        "(chunked prefill is off)", max_len, config.max_num_batched_tokens)
            max_len = config.max_num_batched_tokens
        self.max_model_len = max_len
        self.runner.allocate_kv_cache(num_blocks)
        log.info("KV cache: %d blocks of %d tokens, %s (kv_cache_dtype=%s), %.1f MiB",
                 num_blocks, config.block_size, config.torch_kv_cache_dtype,
                 config.kv_cache_dtype, num_blocks * kv_bytes_per_block(
                     model, config.block_size, config.torch_kv_cache_dtype) / 2**20)
        self.runner.prepare_decode(min(config.max_num_seqs, config.cuda_graph_max_batch),
                                   max_len, config.enable_cuda_graphs)
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                 model_id, sliding_window=model.config.kv_window)
        swap, policy = self._swap_setup(config, model)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.enable_chunked_prefill,
                                   StopConditions(frozenset(self.eos_token_ids), max_len),
                                   swap=swap, preemption=policy,
                                   pacer=self._pacer(config))
        generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.sampler = Sampler(generator)
        self.sampling_batches = SamplingBatchBuilder(self.vocab_size, self.eos_token_ids,
                                                     self.device)
        self.speculator = self._speculator(config, max_len, draft_model)
        self.requests: dict[str, RequestState] = {}
        self.beam_groups: dict[str, BeamGroup] = {}
        self._pending: list[StepOutput] = []
        self._arrivals = itertools.count()
        self.num_steps = 0

    def _draft_weights(self, config: EngineConfig, model: CausalLM,
                       draft_model: CausalLM | None) -> CausalLM | None:
        """The draft model for ``draft:...`` (given, or loaded now: before the KV pools
        are sized, which must count its weights and its own pool); None otherwise."""
        if config.speculative_method != "draft" or draft_model is not None:
            return draft_model
        from kvrelay_worker.engine.speculative.draft_model import DraftModel

        max_len = self._default_max_len(config, model.config.max_position_embeddings)
        return DraftModel.load_model(config.speculative_draft_model or "draft", config,
                                     max_len)

    def _speculator(self, config: EngineConfig, max_len: int,
                    draft_model: CausalLM | None) -> Speculator | None:
        method = config.speculative_method
        if method == "off":
            return None
        draft = None
        if method == "draft":
            from kvrelay_worker.engine.speculative.draft_model import DraftModel

            assert draft_model is not None, "loaded by _draft_weights"
            name = config.speculative_draft_model or "draft"
            draft = DraftModel.of_model(draft_model, config, self.vocab_size,
                                        self.kv.num_blocks, name)
        return Speculator(max_drafts=config.num_speculative_tokens,
                          ngram_min=config.speculative_ngram_min,
                          ngram_max=config.speculative_ngram_max,
                          max_model_len=max_len, draft=draft,
                          adaptive=config.speculative_adaptive)

    @staticmethod
    def _pacer(config: EngineConfig) -> PrefillPacer | None:
        if config.target_step_ms is None:
            return None
        return PrefillPacer(config.target_step_ms,
                            min(config.min_prefill_chunk, config.max_num_batched_tokens))

    def _swap_setup(self, config: EngineConfig, model: CausalLM
                    ) -> tuple[SwapSpace | None, PreemptionPolicy]:
        """The host pool (bookkeeping and tensors) and the preemption policy."""
        mode = preemption_mode(config.preemption_mode)
        num_host_blocks = decide_num_swap_blocks(config, self.runner)
        self.host_kv_caches: list[torch.Tensor] = []
        if num_host_blocks < 1:
            return None, PreemptionPolicy("recompute")
        self.host_kv_caches = allocate_host_kv(self.runner.kv_caches, num_host_blocks)
        per_block = kv_bytes_per_block(model, config.block_size, config.torch_kv_cache_dtype)
        num_params = sum(p.numel() for p in model.parameters())
        cost = SwapCostModel.estimate(num_params, per_block, self.device)
        return SwapSpace(num_host_blocks), PreemptionPolicy(mode, cost)

    # ------------------------------------------------------------------ requests

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None,
                    prior_outputs: Seq[Seq[int]] | None = None,
                    prior_texts: Seq[str] | None = None,
                    prior_finish_reasons: Seq[str | None] | None = None) -> list[int]:
        """Validate a request and queue it; return its prompt token ids.

        ``prior_*`` resume a request an earlier attempt started (failover): per choice,
        the tokens and text it already reported, and a finish reason for choices that had
        already ended. Generation continues after them; they are never reported again.
        Bad input raises before anything is queued, so the engine is left as it was.
        """
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        prompt_ids = prompt_token_ids(prompt, self.tokenizer, self.vocab_size,
                                      self.max_model_len)
        self._check_sampling(params, prompt_ids)
        prior = PriorChoices.checked(prior_outputs, prior_texts, prior_finish_reasons,
                                      self.vocab_size)
        if params.reports_at_end and not prior.is_empty:
            raise InvalidPromptError("a best_of or beam search request cannot resume from "
                                     "prior outputs: its candidates were never reported; "
                                     "restart it")
        grammar = self.grammars.compile(params.response_format)
        state = self._new_request(request_id, prompt, prompt_ids, params, priority,
                                  cache_salt, prior)
        if grammar is not None:  # a matcher per choice, through what it already sent
            for choice in state.choices:
                if choice.finish_reason is None:
                    choice.seq.grammar = self.grammars.matcher(
                        grammar, choice.seq.output_token_ids)
        self._queue(state)
        return prompt_ids

    def _check_sampling(self, params: SamplingParams, prompt_ids: list[int]) -> None:
        """Refuse options the sampler could not apply, now rather than inside a step.

        The request's sampling row is built once, as a step would build it: a value that
        passes the type checks but breaks tensor building fails here, alone.
        """
        for t in params.stop_token_ids or ():
            if t >= self.vocab_size:
                raise InvalidPromptError(f"stop token id {t} is outside the vocabulary")
        probe = Sequence(request_id="", choice_index=0, token_ids=list(prompt_ids),
                         num_prompt_tokens=len(prompt_ids), params=params)
        try:
            build_sampling_batch([probe], self.vocab_size, self.eos_token_ids, self.device)
        except Exception as exc:
            raise SamplingParamsError(f"the sampling options cannot be applied: {exc}") from exc

    def _new_request(self, request_id: str, prompt: Prompt, prompt_ids: list[int],
                     params: SamplingParams, priority: int, cache_salt: str | None,
                     prior: PriorChoices) -> RequestState:
        """The request's state: one sequence, detokenizer and finish per choice (per
        candidate with best_of; ``RequestState`` reports the winners)."""
        arrival = next(self._arrivals)
        choices: list[ChoiceState] = []
        for index in range(params.num_candidates):
            tokens = prior.tokens(index)
            seq = Sequence(request_id=request_id, choice_index=index,
                           token_ids=prompt_ids + tokens, num_prompt_tokens=len(prompt_ids),
                           params=params, priority=priority, arrival_order=arrival,
                           cache_salt=cache_salt)
            detok = IncrementalDetokenizer(self.tokenizer, prompt_ids, params.stop_strings,
                                           params.skip_special_tokens, params.min_tokens)
            if tokens:
                detok.resume(tokens, prior.text(index))
            choice = ChoiceState(seq=seq, detok=detok,
                                 logprobs=[] if params.logprobs is not None else None,
                                 cumulative_logprob=(0.0 if params.needs_token_logprobs
                                                     and not tokens else None))
            status = self.scheduler.stop.length_status(seq)
            reason = prior.finish_reason(index) or (status.value if status else None)
            if reason is not None:
                choice.finish_reason = reason
                choice.reported_finish = True
                seq.status = SequenceStatus(reason)
            choices.append(choice)
        return RequestState(request_id, prompt if isinstance(prompt, str) else None,
                            prompt_ids, choices, num_returned=params.n)

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

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; reported as ``abort`` by the next step."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return False
        self.beam_groups.pop(request_id, None)
        for choice in state.choices:
            if choice.finish_reason is None:
                self.scheduler.finish(choice.seq, SequenceStatus.FINISHED_ABORTED)
                choice.finish_reason = "abort"
        self._pending.append(state.step_output())
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._pending)

    # ---------------------------------------------------------------------- step

    def step(self) -> list[StepOutput]:
        """Schedule, execute, sample, update; report every request the step touched.

        When the step raises, it is retried on halves of the batch until the requests
        that make it fail are alone; those fail (``StepOutput.error``), the rest go on.
        A sticky device error (``device_errors.py``) is raised instead: it is no
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
        self.num_steps += 1
        touched: dict[str, RequestState] = {}
        try:
            sampled = self._execute_and_sample(sched.layout)
        except Exception as exc:
            if is_sticky_device_error(exc):
                raise  # the device is lost for every request: no part of the batch can run
            log.warning("engine step failed (%r); retrying its batch in parts to find "
                        "the request that makes it fail", exc)
            self._isolate_failure(sched.scheduled, touched)
        else:
            self._update(sched.layout, sampled, touched)
            # The whole step, as a decoding stream waits for it: its device work done too
            # (a step where no row samples read nothing back).
            ms = self.step_timer.elapsed_ms()
            self.scheduler.observe_step(sched, ms)
            if self.speculator is not None:
                self.speculator.observe_step(sched.num_batched_tokens, ms)
        for request_id, state in touched.items():
            outputs.append(state.step_output())
            if state.finished:
                del self.requests[request_id]
                self.beam_groups.pop(request_id, None)
        return outputs

    def _execute_and_sample(self, layout: BatchLayout) -> SamplerOutput | None:
        """Run the model on ``layout``'s batch and sample its rows; changes no sequence.

        A row after a draft samples as its output position would without speculation
        (``speculative/verification.py``); a beam's row also gives its best candidates.
        """
        logits = self.runner.execute(layout.scheduled, layout=layout)
        if not layout.num_rows:
            return None
        batch = self.sampling_batches.build(layout.row_seqs, layout.row_offsets)
        result = self.sampler(logits, batch)
        if layout.beam_rows:  # what beam search ranks: log_softmax of the raw logits
            per_beam = max(self.beam_groups[layout.row_seqs[row].request_id]
                           .candidates_per_beam for row in layout.beam_rows)
            result.beam_log_probs, result.beam_token_ids = beam_candidates(
                logits[layout.beam_rows], per_beam)
        return result

    def _update(self, layout: BatchLayout, result: SamplerOutput | None,
                touched: dict[str, RequestState]) -> None:
        """Let the scheduler apply the step, then report each sequence's new tokens."""
        update = self.scheduler.update_from_output(layout, result.token_ids if result else [])
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
                sampled = self._execute_and_sample(layout)
            except Exception as exc:
                if is_sticky_device_error(exc):
                    raise
                if len(part) == 1:
                    self._fail_request(part[0].seq.request_id, exc, touched)
                else:
                    middle = len(part) // 2
                    parts += [part[middle:], part[:middle]]
                continue
            self._update(layout, sampled, touched)

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

    # --------------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        s = self.scheduler.stats
        swap = self.scheduler.swap
        total = self.kv.num_blocks
        free = self.kv.num_free_blocks
        return {
            "running": self.scheduler.num_running,
            "waiting": self.scheduler.num_waiting,
            "requests": len(self.requests),
            "free_blocks": free,
            "total_blocks": total,
            "kv_usage": (total - free) / total if total else 0.0,
            "prefix_cache_hits": s.prefix_cache_hits,
            "prefix_cache_queries": s.prefix_cache_queries,
            "prefix_cache_hit_rate": (
                s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0
            ),
            "prefill_waits": s.prefill_waits,
            "preemptions": s.preemptions,
            "swaps_out": s.swaps_out,
            "swaps_in": s.swaps_in,
            "recomputes": s.recomputes,
            "swapped": self.scheduler.num_swapped,
            "free_swap_blocks": swap.num_free_blocks if swap is not None else 0,
            "total_swap_blocks": swap.num_blocks if swap is not None else 0,
            "max_batch_size": s.max_batch_size,
            "steps": self.num_steps,
            "weight_bytes": self.weight_bytes,
            "max_model_len": self.max_model_len,
            "block_size": self.config.block_size,
            **(self.speculator.stats.as_dict() if self.speculator is not None else {}),
        }
