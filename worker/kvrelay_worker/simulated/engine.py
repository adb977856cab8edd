"""``SimulatedEngine``: the ``LLMEngine`` door (add_request / abort_request / step / stats)
with no model behind it.

Each ``step`` schedules like the real engine in miniature (running decodes first, then
prompt chunks up to the token budget, at most ``max_num_seqs`` sequences), emits one
deterministic token per running choice, and then sleeps until the step has lasted what
``StepTimeModel`` says a GPU would take for the tokens it batched. So a worker built on it
paces its events, holds its jobs and loads Redis as a GPU worker would, while its own
CPU cost stays that of the worker's Python path alone.

A choice's tokens depend only on the prompt, the choice's index and the position, so a
job taken over after its worker died continues exactly where the log stopped. There are
no logits: requests that need them (logprobs, prompt_logprobs, best_of, beam search,
response_format) are refused with a clear error.
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

from kvrelay.protocol import ToolCallDelta
from kvrelay_worker.engine.errors import EngineInputError, InvalidPromptError
from kvrelay_worker.engine.outputs import ChoiceDelta, CompletionChoice, RequestOutput, StepOutput
from kvrelay_worker.engine.prefill_rate import PrefillRate
from kvrelay_worker.engine.prompt import Prompt, prompt_token_ids
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.simulated.step_time import StepTimeModel
from kvrelay_worker.simulated.tokenizer import VOCAB_SIZE, SimulatedTokenizer

DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_MAX_BATCHED_TOKENS = 8192
_BLOCK_SIZE = 16
# Seconds of latest steps whose modeled durations the stats summarise (p50, p99).
_RECENT_S = 20.0
# Large odd multipliers spread a choice's tokens over the vocabulary.
_INDEX_MULT = 7919
_POSITION_MULT = 104_729


@dataclass
class _Choice:
    index: int
    tokens: list[int]
    text: str
    finish_reason: str | None = None
    # How much of ``text`` was reported (prior text counts as reported).
    sent_chars: int = 0


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    choices: list[_Choice]
    seed: int
    # Tokens to prefill before the first new token: the prompt and any prior output.
    prefill_total: int
    prefilled: int = 0
    deltas: list[ChoiceDelta] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)

    @property
    def live_choices(self) -> list[_Choice]:
        return [c for c in self.choices if c.finish_reason is None]


class SimulatedEngine:
    """Stands in for ``LLMEngine`` inside a worker (see the module's docstring)."""

    def __init__(self, model: StepTimeModel, *, max_num_seqs: int = 64,
                 max_num_batched_tokens: int | None = None, max_model_len: int | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if max_num_seqs < 1:
            raise EngineInputError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max(max_num_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS,
                                          max_num_seqs)
        self.max_model_len = max_model_len or DEFAULT_MAX_MODEL_LEN
        self.tokenizer = SimulatedTokenizer()
        self.vocab_size = VOCAB_SIZE
        self.device = "simulated"
        self._sleep = sleep
        self._clock = clock
        self.requests: dict[str, _Request] = {}
        self._waiting: deque[str] = deque()
        self._running: list[str] = []
        self._pending: list[StepOutput] = []
        self.num_steps = 0
        self.batched_tokens = 0
        self.modeled_seconds = 0.0
        # (when, modeled seconds) of the steps of the last ``_RECENT_S``: what a stream's
        # token gap is made of, so a benchmark can tell delivery delays from the steps.
        self.recent_steps: deque[tuple[float, float]] = deque()
        self.max_batch_size = 0
        # Prompt tokens per second of the latest prefill steps, as lived (slept) here.
        self.prefill_rate = PrefillRate()

    # ------------------------------------------------------------------ requests

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None,
                    prior_outputs: Seq[Seq[int]] | None = None,
                    prior_texts: Seq[str] | None = None,
                    prior_finish_reasons: Seq[str | None] | None = None,
                    prior_reasoning: Seq[str] | None = None,
                    prior_tool_calls: Seq[Seq[ToolCallDelta]] | None = None) -> list[int]:
        """Queue a request (``prior_*`` resume one, as ``LLMEngine.add_request``; its
        text is never reasoning or tool calls, so those two are always empty)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        prompt_ids = prompt_token_ids(prompt, self.tokenizer, self.vocab_size,
                                      self.max_model_len)
        self._check_supported(params)
        choices = []
        for index in range(params.n):
            tokens = list(prior_outputs[index]) if prior_outputs and index < len(
                prior_outputs) else []
            text = prior_texts[index] if prior_texts and index < len(prior_texts) else ""
            reason = (prior_finish_reasons[index] if prior_finish_reasons
                      and index < len(prior_finish_reasons) else None)
            choices.append(_Choice(index, tokens, text, reason, sent_chars=len(text)))
        seed = zlib.crc32(b"".join(t.to_bytes(4, "little") for t in prompt_ids))
        request = _Request(request_id, prompt_ids, params, choices, seed,
                           prefill_total=len(prompt_ids) + max(len(c.tokens) for c in choices))
        for choice in choices:  # a resumed choice may already be at its limit
            if choice.finish_reason is None:
                self._check_length(request, choice)
        if request.finished:  # every choice had ended before: report the end at once
            self._pending.append(self._output(request))
            return prompt_ids
        self.requests[request_id] = request
        self._waiting.append(request_id)
        return prompt_ids

    def _check_supported(self, params: SamplingParams) -> None:
        unsupported = [name for name, used in (
            ("logprobs", params.logprobs is not None),
            ("prompt_logprobs", params.prompt_logprobs is not None),
            ("best_of", params.selects_best),
            ("beam search", params.is_beam_search),
            ("response_format", params.response_format is not None),
        ) if used]
        if unsupported:
            raise InvalidPromptError(
                f"the simulated engine has no logits and cannot serve {', '.join(unsupported)}")
        if params.n > self.max_num_seqs:
            raise InvalidPromptError(f"n={params.n} exceeds max_num_seqs={self.max_num_seqs}")

    def abort_request(self, request_id: str, *, report: bool = True) -> bool:
        """Stop a request now; reported as ``abort`` by the next step (``report=False``:
        never reported)."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        if request_id in self._running:
            self._running.remove(request_id)
        else:
            self._waiting.remove(request_id)
        deltas = []
        for choice in request.live_choices:
            choice.finish_reason = "abort"
            deltas.append(ChoiceDelta(choice.index, [], "", finish_reason="abort"))
        request.deltas = deltas
        if report:
            self._pending.append(self._output(request))
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._pending)

    # ---------------------------------------------------------------------- step

    def step(self) -> list[StepOutput]:
        """Run one step: decode every running choice, prefill what the budget allows,
        then sleep out the rest of the step's modeled duration."""
        started = self._clock()
        outputs, self._pending = self._pending, []
        self._admit()
        budget = self.max_num_batched_tokens
        batched = 0
        prefilled = 0
        batch_size = 0
        touched: list[_Request] = []
        for request in [self.requests[r] for r in self._running]:
            if request.prefilled < request.prefill_total:
                continue
            live = request.live_choices
            batched += len(live)
            batch_size += len(live)
            for choice in live:
                self._emit(request, choice)
            touched.append(request)
        for request in [self.requests[r] for r in self._running]:
            todo = request.prefill_total - request.prefilled
            if todo <= 0 or request in touched:
                continue
            chunk = min(todo, budget - batched)
            if chunk <= 0:
                break
            request.prefilled += chunk
            batched += chunk
            prefilled += chunk
            if request.prefilled == request.prefill_total:
                live = request.live_choices
                batch_size += len(live)
                for choice in live:
                    self._emit(request, choice)
                touched.append(request)
        for request in touched:
            if request.deltas:
                outputs.append(self._output(request))
            if request.finished:
                del self.requests[request.request_id]
                self._running.remove(request.request_id)
        self._account(batched, batch_size)
        remaining = self.model.seconds(batched) - (self._clock() - started)
        if batched and remaining > 0:
            self._sleep(remaining)
        self.prefill_rate.observe(prefilled, max(self._clock() - started,
                                                 self.model.seconds(batched)))
        return outputs

    def _admit(self) -> None:
        """Move waiting requests into the running batch while sequences are free."""
        held = sum(len(self.requests[r].live_choices) for r in self._running)
        while self._waiting:
            request = self.requests[self._waiting[0]]
            if held + len(request.live_choices) > self.max_num_seqs:
                return
            held += len(request.live_choices)
            self._running.append(self._waiting.popleft())

    def _emit(self, request: _Request, choice: _Choice) -> None:
        """Append this choice's next token; finish it on a stop or a length limit."""
        position = len(choice.tokens)
        token = (request.seed + _INDEX_MULT * choice.index + _POSITION_MULT * position) \
            % self.vocab_size
        choice.tokens.append(token)
        choice.text += self.tokenizer.token_text(token)
        params = request.params
        if len(choice.tokens) >= params.min_tokens:
            if params.stop_token_ids and token in params.stop_token_ids:
                choice.finish_reason = "stop"
            for stop in params.stop_strings:
                at = choice.text.find(stop, max(0, choice.sent_chars - len(stop) + 1))
                if at >= 0:
                    choice.text = choice.text[:max(at, choice.sent_chars)]
                    choice.finish_reason = "stop"
                    break
        if choice.finish_reason is None:
            self._check_length(request, choice)
        text = choice.text[choice.sent_chars:]
        choice.sent_chars = len(choice.text)
        request.deltas.append(ChoiceDelta(choice.index, [token], text,
                                          finish_reason=choice.finish_reason))

    def _check_length(self, request: _Request, choice: _Choice) -> None:
        limit = request.params.max_tokens
        if (limit is not None and len(choice.tokens) >= limit) or \
                len(request.prompt_ids) + len(choice.tokens) >= self.max_model_len:
            choice.finish_reason = "length"

    def _output(self, request: _Request) -> StepOutput:
        deltas, request.deltas = request.deltas, []
        finished = request.finished
        output = None
        if finished:
            output = RequestOutput(
                request.request_id, request.prompt_ids,
                [CompletionChoice(c.index, c.text, c.tokens, c.finish_reason)
                 for c in request.choices],
                num_generated_tokens=sum(len(c.tokens) for c in request.choices))
        return StepOutput(request.request_id, deltas, finished,
                          num_prompt_tokens=len(request.prompt_ids), num_cached_tokens=0,
                          output=output)

    def _account(self, batched: int, batch_size: int) -> None:
        if not batched:
            return
        self.num_steps += 1
        self.batched_tokens += batched
        seconds = self.model.seconds(batched)
        self.modeled_seconds += seconds
        now = time.monotonic()
        self.recent_steps.append((now, seconds))
        while self.recent_steps[0][0] < now - _RECENT_S:
            self.recent_steps.popleft()
        self.max_batch_size = max(self.max_batch_size, batch_size)

    # --------------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        """The real engine's keys (KV figures as if every sequence held its blocks) and
        the simulation's own: batched tokens and modeled seconds over all steps, and the
        p50 and p99 of the modeled step times of the last ``_RECENT_S`` seconds."""
        total = self.max_num_seqs * (self.max_model_len // _BLOCK_SIZE)
        recent = [seconds for _, seconds in self.recent_steps]
        used = sum(
            (len(r.prompt_ids) + max(len(c.tokens) for c in r.choices)) // _BLOCK_SIZE + 1
            for r in (self.requests[i] for i in self._running))
        return {
            "running": len(self._running), "waiting": len(self._waiting),
            "requests": len(self.requests), "free_blocks": total - used,
            "total_blocks": total, "kv_usage": used / total,
            "prefix_cache_hits": 0, "prefix_cache_queries": 0, "prefix_cache_hit_rate": 0.0,
            "prefill_waits": 0, "preemptions": 0, "swaps_out": 0, "swaps_in": 0, "recomputes": 0, "swapped": 0,
            "free_swap_blocks": 0, "total_swap_blocks": 0,
            "max_batch_size": self.max_batch_size, "steps": self.num_steps,
            "max_model_len": self.max_model_len, "block_size": _BLOCK_SIZE,
            "simulated": True, "simulated_batched_tokens": self.batched_tokens,
            "simulated_modeled_s": self.modeled_seconds,
            "simulated_step_ms_p50": _percentile(recent, 0.50) * 1000,
            "simulated_step_ms_p99": _percentile(recent, 0.99) * 1000,
            "prefill_tokens_per_s": self.prefill_rate.tokens_per_s(),
        }


def _percentile(values: Seq[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; 0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
