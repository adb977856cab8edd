"""Bookkeeping for one request: its choices, their text, logprobs and unreported news."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvrelay_worker.engine.detokenizer import IncrementalDetokenizer
from kvrelay_worker.engine.errors import RequestFailedError
from kvrelay_worker.engine.outputs import (
    ChoiceDelta,
    CompletionChoice,
    RequestOutput,
    StepOutput,
    TokenLogprob,
)
from kvrelay_worker.engine.sequence import Sequence


@dataclass
class ChoiceState:
    seq: Sequence
    detok: IncrementalDetokenizer
    logprobs: list[TokenLogprob] | None
    new_ids: list[int] = field(default_factory=list)
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    reported_finish: bool = False

    @property
    def has_news(self) -> bool:
        return bool(self.new_ids) or (self.finish_reason is not None and not self.reported_finish)

    def take_delta(self) -> ChoiceDelta:
        finished = self.finish_reason is not None
        if finished:
            self.detok.flush()
        delta = ChoiceDelta(
            index=self.seq.choice_index,
            token_ids=self.new_ids,
            text=self.detok.take_delta(finished),
            logprobs=self.new_logprobs if self.logprobs is not None else None,
            finish_reason=self.finish_reason,
        )
        self.new_ids = []
        self.new_logprobs = []
        self.reported_finish = finished
        return delta


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    choices: list[ChoiceState]
    error: RequestFailedError | None = None

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)

    @property
    def num_cached_tokens(self) -> int:
        return max(self.choices[0].seq.num_cached_tokens, 0)

    def step_output(self) -> StepOutput:
        deltas = [c.take_delta() for c in self.choices if c.has_news]
        finished = self.finished
        return StepOutput(
            request_id=self.request_id,
            deltas=deltas,
            finished=finished,
            num_prompt_tokens=len(self.prompt_token_ids),
            num_cached_tokens=self.num_cached_tokens,
            output=self.final_output() if finished else None,
            error=self.error,
        )

    def final_output(self) -> RequestOutput:
        choices = [
            CompletionChoice(
                index=c.seq.choice_index,
                text=c.detok.text,
                token_ids=c.seq.output_token_ids,
                finish_reason=c.finish_reason,
                logprobs=c.logprobs,
            )
            for c in self.choices
        ]
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            choices=choices,
            num_cached_tokens=self.num_cached_tokens,
            prompt=self.prompt,
        )
