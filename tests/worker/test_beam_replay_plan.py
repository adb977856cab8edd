"""A taken-over beam-search job restarts from its prompt: beams are never resumed from
tokens a dead worker published, and beams already published whole are not sent again
(the same rule best_of follows); an ordinary job continues from its tokens."""

from __future__ import annotations

from kvrelay_worker.engine import SamplingParams
from kvrelay_worker.jobs.job_store import PriorProgress
from kvrelay_worker.jobs.prior_replay import ReplayPlan


def test_beam_job_restarts_from_its_prompt() -> None:
    beams = SamplingParams(beam_width=4, n=2, max_tokens=8)
    assert beams.reports_at_end
    # Beam 0 was published whole (with its finish reason) before the worker died.
    prior = PriorProgress(next_seq=3, tokens={0: [5, 6, 7]}, texts={0: ["abc"]},
                          finish_reasons={0: "length"})
    plan = ReplayPlan.of(beams, prior)
    assert (plan.outputs, plan.texts, plan.finish_reasons) == (None, None, None)
    assert plan.published == {0: "length"}


def test_an_ordinary_job_continues_from_its_tokens() -> None:
    plain = SamplingParams(max_tokens=8)
    assert not plain.reports_at_end
    prior = PriorProgress(next_seq=3, tokens={0: [5, 6]}, texts={0: ["a", "b"]})
    plan = ReplayPlan.of(plain, prior)
    assert plan.outputs == [[5, 6]]
    assert plan.texts == ["ab"]
    assert plan.published == {}
