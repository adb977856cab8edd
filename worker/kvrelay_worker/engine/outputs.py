"""What the engine hands back: per-step deltas for streaming, whole outputs at the end."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvrelay.protocol import ToolCall, ToolCallDelta
from kvrelay_worker.engine.errors import RequestFailedError


@dataclass
class SampledLogprob:
    """A sampled token's log-probability and the most likely alternatives at its position."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class CompletionChoice:
    """One sampled completion of a prompt."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[SampledLogprob] | None = None
    # Sum of the sampled tokens' logprobs (``SampledLogprob.logprob``: log_softmax of the
    # logits after bias, bans, penalties and temperature, before top-k/top-p/min-p; see
    # ``sampler``). Set when the request asked for logprobs or ranks best_of candidates;
    # None when unknown (a choice resumed after tokens this attempt never scored).
    cumulative_logprob: float | None = None
    # Beam search: the beam's score, as transformers' ``sequences_scores``.
    beam_score: float | None = None
    # With output parsers (``engine/tools``): the reasoning apart from ``text``, and the
    # tools the model called (``finish_reason`` is then "tool_calls").
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class RequestOutput:
    """A finished request. ``text``, ``token_ids``, ... mirror the first choice."""

    request_id: str
    prompt_token_ids: list[int]
    choices: list[CompletionChoice]
    num_cached_tokens: int = 0
    prompt: str | None = None
    # Tokens generated for the request, best_of candidates that lost included.
    num_generated_tokens: int = 0
    # With ``prompt_logprobs``: one entry per prompt token (None for the first), each the
    # token's log-probability under the model's raw distribution given the tokens before
    # it, with that many most likely alternatives (``runner/prompt_scoring.py``).
    prompt_logprobs: list[SampledLogprob | None] | None = None

    @property
    def text(self) -> str:
        return self.choices[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.choices[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.choices[0].finish_reason

    @property
    def logprobs(self) -> list[SampledLogprob] | None:
        return self.choices[0].logprobs

    @property
    def num_output_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.choices)


@dataclass
class ChoiceDelta:
    """What one choice produced in one step (``finish_reason`` set on its last delta)."""

    index: int
    token_ids: list[int]
    text: str
    logprobs: list[SampledLogprob] | None = None
    finish_reason: str | None = None
    # On the last delta of a choice, when known (see ``CompletionChoice``).
    cumulative_logprob: float | None = None
    beam_score: float | None = None
    # Reasoning text and tool-call pieces this step added (``text`` is then the answer's).
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    # Once, on the first delta of choice 0 (see ``RequestOutput.prompt_logprobs``).
    prompt_logprobs: list[SampledLogprob | None] | None = None


@dataclass
class StepOutput:
    """One request's news from one engine step; ``output`` is set once it finished.

    ``error`` is set (and ``finished`` true) when a step failed because of this request.
    """

    request_id: str
    deltas: list[ChoiceDelta]
    finished: bool
    num_prompt_tokens: int
    num_cached_tokens: int
    output: RequestOutput | None = None
    error: RequestFailedError | None = None
