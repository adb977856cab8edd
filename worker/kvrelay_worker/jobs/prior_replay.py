"""What a resumed job hands the engine from earlier attempts, and what it must not send again.

An ordinary job continues each choice after the tokens already in its log. A best_of job
(and a beam search job, which reports its beams the same way)
publishes nothing until its candidates are done, then each winner whole, in one event; so
its log holds either no choice or some winners complete (the worker died between those
events). Candidates are never resumed (a winner's tokens are not a candidate to extend):
the engine restarts the request from its prompt, and winners already in the log are not
published again: the log keeps them, the new attempt fills the other places (the same
winners again when the request is seeded).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvrelay.protocol import ToolCallDelta
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.jobs.job_store import PriorProgress


@dataclass(frozen=True)
class ReplayPlan:
    """The engine's ``prior_*`` arguments, and the choices not to publish again.

    ``reasoning`` and ``tool_calls``: per choice, the reasoning text and the tool-call
    pieces already sent (the engine's parsers, replayed over the prior tokens, skip them).
    """

    outputs: list[list[int]] | None
    texts: list[str] | None
    finish_reasons: list[str | None] | None
    published: dict[int, str]
    reasoning: list[str] | None = None
    tool_calls: list[list[ToolCallDelta]] | None = None

    @classmethod
    def of(cls, params: SamplingParams, prior: PriorProgress) -> ReplayPlan:
        n = params.n
        if params.reports_at_end:  # best_of and beam search alike
            # Only complete winners are ever published (each carries its finish reason).
            published = {i: r for i, r in prior.finish_reasons.items() if 0 <= i < n}
            return cls(None, None, None, published)
        return cls(
            outputs=prior.choice_tokens(n) if prior.has_tokens else None,
            texts=prior.choice_texts(n) if prior.has_tokens else None,
            finish_reasons=prior.choice_finish_reasons(n),
            published={},
            reasoning=prior.choice_reasoning(n) if prior.has_tokens else None,
            tool_calls=prior.choice_tool_calls(n) if prior.has_tokens else None,
        )
