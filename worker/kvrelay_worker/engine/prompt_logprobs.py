"""A request's prompt log-probabilities, gathered chunk by chunk and reported once.

A prompt computed in several chunks (chunked prefill) is scored in several steps; a
prompt preempted by recompute scores its first chunks again (the same values, each
position simply written again). Entry 0 stays None: nothing precedes the first token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvrelay_worker.engine.outputs import SampledLogprob

if TYPE_CHECKING:
    from kvrelay_worker.engine.runner.prompt_scoring import PromptScores


class PromptLogprobs:
    """One entry per prompt token, filled as the engine scores the prompt's positions."""

    def __init__(self, num_prompt_tokens: int) -> None:
        self.entries: list[SampledLogprob | None] = [None] * num_prompt_tokens
        self._missing = max(0, num_prompt_tokens - 1)
        self.reported = False

    @property
    def complete(self) -> bool:
        return self._missing == 0

    def record(self, scores: PromptScores) -> None:
        """Keep one scored chunk (``PromptScores`` of the model runner)."""
        for i, token in enumerate(scores.token_ids):
            index = scores.first_token + i
            if self.entries[index] is None:
                self._missing -= 1
            self.entries[index] = SampledLogprob(
                token_id=token, logprob=scores.logprobs[i],
                top=list(zip(scores.top_ids[i], scores.top_logprobs[i], strict=True)))

    def take(self) -> list[SampledLogprob | None] | None:
        """The whole list, the first time it is complete; None before and after."""
        if self.reported or not self.complete:
            return None
        self.reported = True
        return self.entries
