"""Bookkeeping for one request: its choices, their text, logprobs and unreported news.

A request with ``best_of`` > ``n`` holds ``best_of`` candidate choices and reports nothing
until all of them are done (the winners are unknown before); then it reports the ``n``
best as whole choices, renumbered 0..n-1 in rank order, as if they had been all along.
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvrelay_worker.engine.errors import RequestFailedError
from kvrelay_worker.engine.outputs import (
    ChoiceDelta,
    CompletionChoice,
    RequestOutput,
    SampledLogprob,
    StepOutput,
)
from kvrelay_worker.engine.prompt_logprobs import PromptLogprobs
from kvrelay_worker.engine.sample.detokenizer import IncrementalDetokenizer
from kvrelay_worker.engine.sched.sequence import Sequence
from kvrelay_worker.engine.tools.choice_parsing import reported_reason, split, whole
from kvrelay_worker.engine.tools.output_parsing import OutputParsing

if TYPE_CHECKING:
    from kvrelay_worker.engine.sample.sampler import SamplerOutput


@dataclass
class ChoiceState:
    seq: Sequence
    detok: IncrementalDetokenizer
    logprobs: list[SampledLogprob] | None
    new_ids: list[int] = field(default_factory=list)
    new_logprobs: list[SampledLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    reported_finish: bool = False
    # Sum of the sampled tokens' logprobs; None when not tracked (not asked for, or the
    # choice resumed with tokens whose logprobs this attempt never saw).
    cumulative_logprob: float | None = None
    # A returned beam's score (beam search; see ``beam_group``).
    beam_score: float | None = None
    # Reasoning and tool-call parsers over the text, when the request asks for them.
    parsing: OutputParsing | None = None

    def __post_init__(self) -> None:
        # The sequence feeds its detokenizer each token it appends, so a stop string
        # ends it at that very token (``Sequence.append_token``).
        self.seq.detok = self.detok

    def record_token(self, result: SamplerOutput, row: int) -> None:
        """Note a token the scheduler appended (sampled on ``row``): news to report,
        its logprobs, the finish."""
        token = result.token_ids[row]
        self.new_ids.append(token)
        if self.cumulative_logprob is not None and result.token_logprobs is not None:
            self.cumulative_logprob += result.token_logprobs[row]
        if self.logprobs is not None and result.token_logprobs is not None:
            k = self.seq.params.logprobs or 0
            assert result.top_ids is not None
            assert result.top_logprobs is not None
            entry = SampledLogprob(
                token_id=token,
                logprob=result.token_logprobs[row],
                top=list(zip(result.top_ids[row][:k], result.top_logprobs[row][:k])),
            )
            self.logprobs.append(entry)
            self.new_logprobs.append(entry)
        if self.seq.is_finished:
            self.finish_reason = self.seq.status.value

    @property
    def has_news(self) -> bool:
        return bool(self.new_ids) or (self.finish_reason is not None and not self.reported_finish)

    def take_delta(self) -> ChoiceDelta:
        finished = self.finish_reason is not None
        if finished:
            self.detok.flush()
        parsed = split(self.detok, self.parsing, finished)
        delta = ChoiceDelta(
            index=self.seq.choice_index,
            token_ids=self.new_ids,
            text=parsed.text,
            reasoning=parsed.reasoning,
            tool_calls=parsed.tool_calls,
            logprobs=self.new_logprobs if self.logprobs is not None else None,
            finish_reason=reported_reason(self.parsing, self.finish_reason),
            cumulative_logprob=self.cumulative_logprob if finished else None,
            beam_score=self.beam_score if finished else None,
        )
        self.new_ids = []
        self.new_logprobs = []
        self.reported_finish = finished
        return delta

    def whole_delta(self, index: int) -> ChoiceDelta:
        """The finished choice as one delta under ``index`` (a best_of winner's report)."""
        parsed = whole(self.detok, self.parsing)
        self.new_ids = []
        self.new_logprobs = []
        self.reported_finish = True
        return ChoiceDelta(
            index=index,
            token_ids=self.seq.output_token_ids,
            text=parsed.text,
            reasoning=parsed.reasoning,
            tool_calls=parsed.tool_calls,
            logprobs=self.logprobs,
            finish_reason=reported_reason(self.parsing, self.finish_reason),
            cumulative_logprob=self.cumulative_logprob,
            beam_score=self.beam_score,
        )

    def completion(self, index: int) -> CompletionChoice:
        parsed = whole(self.detok, self.parsing)  # an unreported choice may hold text back
        return CompletionChoice(
            index=index,
            text=parsed.text,
            reasoning=parsed.reasoning,
            tool_calls=[] if self.parsing is None else self.parsing.tool_calls,
            token_ids=self.seq.output_token_ids,
            finish_reason=reported_reason(self.parsing, self.finish_reason),
            logprobs=self.logprobs,
            cumulative_logprob=self.cumulative_logprob,
            beam_score=self.beam_score,
        )


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    choices: list[ChoiceState]
    error: RequestFailedError | None = None
    # Choices returned; fewer than ``choices`` when best_of candidates compete for them.
    num_returned: int | None = None
    # With ``prompt_logprobs`` (unless a resumed choice 0 already reported them).
    prompt_logprobs: PromptLogprobs | None = None

    @property
    def selects(self) -> bool:
        return self.num_returned is not None and self.num_returned < len(self.choices)

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)

    @property
    def num_cached_tokens(self) -> int:
        return max(self.choices[0].seq.num_cached_tokens, 0)

    def winners(self) -> list[ChoiceState]:
        """The returned choices in their order: every choice, or the best candidates."""
        if not self.selects:
            return self.choices
        assert self.num_returned is not None
        scores = [c.cumulative_logprob for c in self.choices]
        return [self.choices[i] for i in best_candidates(scores, self.num_returned)]

    def step_output(self) -> StepOutput:
        finished = self.finished
        if not self.selects:
            deltas = [c.take_delta() for c in self.choices if c.has_news]
        elif finished and not any(c.finish_reason == "abort" for c in self.choices):
            deltas = [c.whole_delta(rank) for rank, c in enumerate(self.winners())]
        else:
            # Candidates stay unreported (an aborted or failed request reports none).
            for c in self.choices:
                c.new_ids, c.new_logprobs = [], []
            deltas = []
        if self.prompt_logprobs is not None:
            self._attach_prompt_logprobs(deltas)
        return StepOutput(
            request_id=self.request_id,
            deltas=deltas,
            finished=finished,
            num_prompt_tokens=len(self.prompt_token_ids),
            num_cached_tokens=self.num_cached_tokens,
            output=self.final_output() if finished else None,
            error=self.error,
        )

    def _attach_prompt_logprobs(self, deltas: list[ChoiceDelta]) -> None:
        """Put the prompt's log-probabilities on the first delta of choice 0, once."""
        assert self.prompt_logprobs is not None
        first = next((d for d in deltas if d.index == 0), None)
        if first is not None:
            first.prompt_logprobs = self.prompt_logprobs.take()

    def final_output(self) -> RequestOutput:
        winners = self.winners()
        choices = [c.completion(c.seq.choice_index if not self.selects else rank)
                   for rank, c in enumerate(winners)]
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            choices=choices,
            num_cached_tokens=self.num_cached_tokens,
            prompt=self.prompt,
            num_generated_tokens=sum(c.seq.num_output_tokens for c in self.choices),
            prompt_logprobs=(self.prompt_logprobs.entries if self.prompt_logprobs is not None
                             and self.prompt_logprobs.complete else None),
        )


def best_candidates(cumulative_logprobs: Seq[float | None], n: int) -> list[int]:
    """Indexes of the ``n`` candidates (``best_of``) with the highest cumulative
    log-probability, best first; ties keep candidate order (so a seeded request picks the
    same winners every time), and an unknown score ranks last."""
    def score(index: int) -> float:
        value = cumulative_logprobs[index]
        return -math.inf if value is None or math.isnan(value) else value

    ranked = sorted(range(len(cumulative_logprobs)), key=lambda i: -score(i))
    return ranked[:n]
