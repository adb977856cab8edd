"""What callers get back: ``StreamChunk`` per token event, ``Completion`` at the end.

Both are ``msgspec.Struct``s: cheap to build on the per-event path (1,000 streams share
one event loop) and they print, compare and serialise like plain records.
``CompletionBuilder`` folds events into a ``Completion`` as they are delivered.
"""

from __future__ import annotations

import msgspec

from kvrelay.protocol import (
    Finished,
    FunctionCall,
    PromptLogprob,
    Started,
    Timings,
    TokenLogprob,
    Tokens,
    ToolCall,
    ToolCallDelta,
    Usage,
)

__all__ = ["Choice", "Completion", "CompletionBuilder", "StreamChunk"]


class StreamChunk(msgspec.Struct, kw_only=True):
    """New tokens of one choice, in the order the worker produced them.

    ``seq`` is the event's position in the job's stream: pass the last one you handled
    to ``client.resume(job_id, after_seq=seq)`` to continue after a dropped connection.
    """

    seq: int
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    # Reasoning text these tokens add (models that think, with a reasoning parser).
    reasoning: str = ""
    # Tool-call pieces these tokens add: ``id`` and ``name`` once, ``arguments`` in parts.
    tool_calls: list[ToolCallDelta] | None = None
    # On the first chunk of choice 0 when ``prompt_logprobs`` was asked (first entry None).
    prompt_logprobs: list[PromptLogprob | None] | None = None


class Choice(msgspec.Struct, kw_only=True):
    """One of the ``n`` generated sequences of a job."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    # Sum of the sampled tokens' log-probabilities, when the worker reports it (always with
    # ``best_of``, and with ``logprobs``): what ``best_of`` ranks candidates by.
    cumulative_logprob: float | None = None
    # Beam search: the beam's score (transformers' ``sequences_scores``); best first.
    beam_score: float | None = None
    # The model's reasoning, apart from ``text`` (models that think).
    reasoning: str = ""
    # The tools the model called (``finish_reason`` is then "tool_calls").
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)


class Completion(msgspec.Struct, kw_only=True):
    """A finished job. ``text``/``token_ids``/``finish_reason``/``logprobs`` mirror choice 0."""

    job_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None
    choices: list[Choice]
    usage: Usage
    timings: Timings
    logprobs: list[TokenLogprob] | None = None
    model: str | None = None
    # The worker that started the job last, and how many times it was started
    # (more than 1 after a worker died and another resumed it).
    worker: str | None = None
    attempts: int = 0
    # Choice 0's reasoning and tool calls; the prompt's log-probabilities when asked.
    reasoning: str = ""
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    prompt_logprobs: list[PromptLogprob | None] | None = None


class _CallParts:
    """One tool call's pieces as they arrive."""

    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


class _ChoiceState:
    """Per-choice accumulation; text deltas are joined once, at the end."""

    __slots__ = ("beam_score", "calls", "cumulative_logprob", "logprobs", "reasoning",
                 "texts", "token_ids")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, _CallParts] = {}
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] | None = None
        self.cumulative_logprob: float | None = None
        self.beam_score: float | None = None

    def add_call_delta(self, delta: ToolCallDelta) -> None:
        parts = self.calls.setdefault(delta.index, _CallParts())
        if delta.id:
            parts.id = delta.id
        if delta.name:
            parts.name = delta.name
        if delta.arguments:
            parts.arguments.append(delta.arguments)

    def tool_calls(self) -> list[ToolCall]:
        return [ToolCall(id=p.id or f"call_{i}",
                         function=FunctionCall(name=p.name, arguments="".join(p.arguments)))
                for i, p in sorted(self.calls.items())]


class CompletionBuilder:
    """Folds a job's events (in seq order) into a ``Completion``.

    With ``keep_output`` False the tokens, text and logprobs are not kept (the
    ``Completion`` has none; finish reasons, usage and timings are still there): for a
    caller that forwards every chunk as it comes and must not hold the whole answer.
    """

    def __init__(self, job_id: str, *, model: str | None = None, n: int = 1,
                 keep_output: bool = True) -> None:
        self.job_id = job_id
        self.keep_output = keep_output
        self.model = model
        self._choices: list[_ChoiceState] = [_ChoiceState() for _ in range(max(n, 1))]
        self.worker: str | None = None
        self.attempts = 0
        self.prompt_tokens = 0
        self.prompt_logprobs: list[PromptLogprob | None] | None = None

    def _choice(self, index: int) -> _ChoiceState:
        while index >= len(self._choices):
            self._choices.append(_ChoiceState())
        return self._choices[index]

    def add_started(self, event: Started) -> None:
        self.worker = event.worker
        self.attempts = max(self.attempts + 1, event.attempt)
        if event.prompt_tokens:
            self.prompt_tokens = event.prompt_tokens

    def add_tokens(self, event: Tokens) -> None:
        choice = self._choice(event.index)
        if event.prompt_logprobs is not None and self.keep_output:
            self.prompt_logprobs = event.prompt_logprobs
        if self.keep_output:
            if event.text:
                choice.texts.append(event.text)
            if event.reasoning:
                choice.reasoning.append(event.reasoning)
            choice.token_ids.extend(event.token_ids)
            if event.logprobs is not None:
                if choice.logprobs is None:
                    choice.logprobs = []
                choice.logprobs.extend(event.logprobs)
        # Tool calls are kept even without ``keep_output``: a forwarding caller still
        # needs them whole (they are small, bounded by the job's tokens).
        for call in event.tool_calls or ():
            choice.add_call_delta(call)
        if event.cumulative_logprob is not None:
            choice.cumulative_logprob = event.cumulative_logprob
        if event.beam_score is not None:
            choice.beam_score = event.beam_score

    def text_of(self, index: int = 0) -> str:
        """The text of choice ``index`` so far (for partial results)."""
        if index >= len(self._choices):
            return ""
        return "".join(self._choices[index].texts)

    def build(self, finished: Finished) -> Completion:
        """The whole completion, once the terminal ``Finished`` event is in."""
        reasons = finished.finish_reasons
        n = max(len(self._choices), len(reasons))
        choices: list[Choice] = []
        for i in range(n):
            state = self._choice(i)
            if i < len(reasons):
                reason: str | None = reasons[i]
            else:
                reason = finished.finish_reason
            if i == 0 and finished.finish_reason:
                reason = finished.finish_reason
            choices.append(
                Choice(
                    index=i,
                    text="".join(state.texts),
                    token_ids=state.token_ids,
                    finish_reason=reason,
                    logprobs=state.logprobs,
                    cumulative_logprob=state.cumulative_logprob,
                    beam_score=state.beam_score,
                    reasoning="".join(state.reasoning),
                    tool_calls=state.tool_calls(),
                )
            )
        usage = finished.usage
        if usage.prompt_tokens == 0 and self.prompt_tokens:
            usage = Usage(
                prompt_tokens=self.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cached_tokens=usage.cached_tokens,
            )
        first = choices[0]
        return Completion(
            job_id=self.job_id,
            text=first.text,
            token_ids=first.token_ids,
            finish_reason=first.finish_reason,
            choices=choices,
            usage=usage,
            timings=finished.timings,
            logprobs=first.logprobs,
            model=self.model,
            worker=self.worker,
            attempts=self.attempts,
            reasoning=first.reasoning,
            tool_calls=first.tool_calls,
            prompt_logprobs=self.prompt_logprobs,
        )
