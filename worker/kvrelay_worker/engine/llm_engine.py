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
from typing import Any

import torch

from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.detokenizer import IncrementalDetokenizer
from kvrelay_worker.engine.device import bind_device
from kvrelay_worker.engine.errors import EngineConfigError, InvalidPromptError
from kvrelay_worker.engine.kv_cache import KVCacheManager
from kvrelay_worker.engine.kv_sizing import decide_num_blocks
from kvrelay_worker.engine.model_runner import ModelRunner
from kvrelay_worker.engine.outputs import StepOutput, TokenLogprob
from kvrelay_worker.engine.prompt import Prompt, prompt_token_ids
from kvrelay_worker.engine.request_state import ChoiceState, RequestState
from kvrelay_worker.engine.sampler import Sampler, SamplerOutput
from kvrelay_worker.engine.sampling_batch import SamplingBatchBuilder
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.scheduler import Scheduler
from kvrelay_worker.engine.sequence import Sequence, SequenceStatus
from kvrelay_worker.models.factory import build_model
from kvrelay_worker.models.llama import LlamaForCausalLM

log = logging.getLogger(__name__)

# What ``prior_finish_reasons`` may say: the finished statuses' values.
_FINISH_REASONS = frozenset(s.value for s in SequenceStatus if s.finished)


def eos_token_ids_of(model: LlamaForCausalLM, tokenizer: Any) -> tuple[int, ...]:
    ids = set(model.config.eos_token_ids)
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(tok_eos, int):
        ids.add(tok_eos)
    return tuple(sorted(ids))


class LLMEngine:
    """Continuous-batching inference over a paged KV cache for one model."""

    def __init__(self, config: EngineConfig, *, progress: bool = False) -> None:
        from kvrelay_worker.models.loader import load_model_source

        bind_device(config.torch_device)  # before any weight, stream or graph exists
        files = load_model_source(config.model, progress=progress)
        max_len = self._default_max_len(config, files.config.max_position_embeddings)
        model = build_model(files.config, files.weights(), config.torch_dtype,
                            config.torch_device, max_position=max_len)
        self._setup(config, model, files.tokenizer, model_id=files.name)

    @classmethod
    def from_model(cls, config: EngineConfig, model: LlamaForCausalLM, tokenizer: Any,
                   model_id: str = "custom") -> LLMEngine:
        """An engine around an already built model (random-weight benchmarks, tests)."""
        engine = cls.__new__(cls)
        engine._setup(config, model, tokenizer, model_id)
        return engine

    @staticmethod
    def _default_max_len(config: EngineConfig, model_max: int) -> int:
        if config.max_model_len is not None and config.max_model_len > model_max:
            raise EngineConfigError(
                f"max_model_len {config.max_model_len} exceeds the model's "
                f"{model_max} positions"
            )
        return config.max_model_len or model_max

    def _setup(self, config: EngineConfig, model: LlamaForCausalLM, tokenizer: Any,
               model_id: str) -> None:
        bind_device(config.torch_device)
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.device = config.torch_device
        self.vocab_size = model.config.vocab_size
        self.eos_token_ids = eos_token_ids_of(model, tokenizer)
        self.runner = ModelRunner(model, config.block_size, self.device, config.torch_dtype)
        num_blocks = decide_num_blocks(config, self.runner)
        capacity = num_blocks * config.block_size
        max_len = self._default_max_len(config, model.config.max_position_embeddings)
        if capacity < max_len:
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
        self.runner.prepare_decode(min(config.max_num_seqs, config.cuda_graph_max_batch),
                                   max_len, config.enable_cuda_graphs)
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                 model_id)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.enable_chunked_prefill)
        generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.sampler = Sampler(generator)
        self.sampling_batches = SamplingBatchBuilder(self.vocab_size, self.eos_token_ids,
                                                     self.device)
        self.requests: dict[str, RequestState] = {}
        self._pending: list[StepOutput] = []
        self._arrivals = itertools.count()
        self.num_steps = 0

    # ------------------------------------------------------------------ requests

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None,
                    prior_outputs: Seq[Seq[int]] | None = None,
                    prior_texts: Seq[str] | None = None,
                    prior_finish_reasons: Seq[str | None] | None = None) -> list[int]:
        """Queue a request; return its prompt token ids.

        ``prior_*`` resume a request an earlier attempt started (failover): per choice,
        the tokens and text it already reported, and a finish reason for choices that had
        already ended. Generation continues after them; they are never reported again.
        Choices past the end of a ``prior_*`` list have no prior tokens, text or reason.
        Bad input raises before anything is queued, so the engine is left as it was.
        """
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        prompt_ids = prompt_token_ids(prompt, self.tokenizer, self.vocab_size,
                                      self.max_model_len)
        for t in params.stop_token_ids or ():
            if t >= self.vocab_size:
                raise InvalidPromptError(f"stop token id {t} is outside the vocabulary")
        priors = [list(p) for p in (prior_outputs or [])]
        for p in priors:
            if any(not 0 <= t < self.vocab_size for t in p):
                raise InvalidPromptError("prior output has a token outside the vocabulary")
        texts = list(prior_texts or [])
        reasons = list(prior_finish_reasons or [])
        for reason in reasons:
            if reason is not None and reason not in _FINISH_REASONS:
                raise InvalidPromptError(
                    f"prior finish reason {reason!r} is not one of {sorted(_FINISH_REASONS)}")
        arrival = next(self._arrivals)
        choices: list[ChoiceState] = []
        # Queued only once every choice is built: a failure half-way must not leave
        # sequences in the scheduler that no request state owns (they would never finish).
        to_schedule: list[Sequence] = []
        first: Sequence | None = None
        for index in range(params.n):
            prior = priors[index] if index < len(priors) else []
            seq = Sequence(
                request_id=request_id,
                choice_index=index,
                token_ids=prompt_ids + prior,
                num_prompt_tokens=len(prompt_ids),
                params=params,
                priority=priority,
                arrival_order=arrival,
                cache_salt=cache_salt,
            )
            detok = IncrementalDetokenizer(self.tokenizer, prompt_ids, params.stop_strings,
                                           params.skip_special_tokens, params.min_tokens)
            if prior:
                detok.resume(prior, texts[index] if index < len(texts) else "")
            choice = ChoiceState(seq=seq, detok=detok,
                                 logprobs=[] if params.logprobs is not None else None)
            choices.append(choice)
            reason = reasons[index] if index < len(reasons) else None
            reason = reason or self._length_reason(seq)
            if reason is not None:
                choice.finish_reason = reason
                choice.reported_finish = True
                seq.status = SequenceStatus(reason)
                continue
            if first is None:
                first = seq
            elif self.config.enable_prefix_caching:
                seq.waits_for = first
            to_schedule.append(seq)
        for seq in to_schedule:
            self.scheduler.add(seq)
        state = RequestState(request_id, prompt if isinstance(prompt, str) else None,
                             prompt_ids, choices)
        self.requests[request_id] = state
        if state.finished:
            self._pending.append(state.step_output())
            del self.requests[request_id]
        return prompt_ids

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; reported as ``abort`` by the next step."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return False
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
        outputs, self._pending = self._pending, []
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return outputs
        self.num_steps += 1
        logits = self.runner.execute(sched.scheduled)
        sampling = [item.seq for item in sched.scheduled if item.samples]
        result: SamplerOutput | None = None
        if sampling:
            batch = self.sampling_batches.build(sampling)
            result = self.sampler(logits, batch)
        for item in sched.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            self.kv.publish_computed_blocks(item.seq)
        touched: dict[str, RequestState] = {}
        if result is not None:
            for row, seq in enumerate(sampling):
                # A scheduled sequence's request is always here: requests leave only once
                # every choice is finished, and a finished sequence is never scheduled.
                state = self.requests[seq.request_id]
                self._accept_token(state.choices[seq.choice_index], result, row)
                touched[seq.request_id] = state
        for request_id, state in touched.items():
            outputs.append(state.step_output())
            if state.finished:
                del self.requests[request_id]
        return outputs

    def _accept_token(self, choice: ChoiceState, result: SamplerOutput, row: int) -> None:
        seq = choice.seq
        token = result.token_ids[row]
        seq.append_token(token)
        choice.new_ids.append(token)
        if choice.logprobs is not None and result.token_logprobs is not None:
            k = seq.params.logprobs or 0
            assert result.top_ids is not None
            assert result.top_logprobs is not None
            entry = TokenLogprob(
                token_id=token,
                logprob=result.token_logprobs[row],
                top=list(zip(result.top_ids[row][:k], result.top_logprobs[row][:k])),
            )
            choice.logprobs.append(entry)
            choice.new_logprobs.append(entry)
        stopped_by_string = choice.detok.add_token(token)
        reason = self._finish_reason(seq, token, stopped_by_string)
        if reason is not None:
            choice.finish_reason = reason
            self.scheduler.finish(seq, SequenceStatus(reason))

    def _finish_reason(self, seq: Sequence, token: int, stopped_by_string: bool) -> str | None:
        params = seq.params
        if seq.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token in self.eos_token_ids:
                return "stop"
            if params.stop_token_ids and token in params.stop_token_ids:
                return "stop"
            if stopped_by_string:
                return "stop"
        return self._length_reason(seq)

    def _length_reason(self, seq: Sequence) -> str | None:
        max_tokens = seq.params.max_tokens
        if max_tokens is not None and seq.num_output_tokens >= max_tokens:
            return "length"
        if seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    # --------------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        s = self.scheduler.stats
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
            "preemptions": s.preemptions,
            "max_batch_size": s.max_batch_size,
            "steps": self.num_steps,
            "max_model_len": self.max_model_len,
            "block_size": self.config.block_size,
        }
