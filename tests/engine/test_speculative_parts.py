"""The pieces of speculative decoding on their own: lookups, acceptance, step-time curve,
and the per-step policy's choices in the regimes it must tell apart."""

from __future__ import annotations

import random

import pytest

from kvrelay_worker.engine.spec.acceptance import Acceptance
from kvrelay_worker.engine.spec.ngram_index import NgramIndex
from kvrelay_worker.engine.spec.policy import Candidate, choose_depths
from kvrelay_worker.engine.spec.recent_outputs import RecentOutputs
from kvrelay_worker.engine.spec.step_time_curve import StepTimeCurve
from kvrelay_worker.engine.spec.verification import accepted_length


def test_lookup_proposes_what_followed_the_latest_longest_match() -> None:
    index = NgramIndex(1, 3)
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 3, 4, 6, 7]
    # The 3-gram (4, 6, 7) never occurred before; (6, 7) did, latest at 6..7 -> 3, 4, ...
    assert index.propose(tokens, 3) == [3, 4, 6]
    # Neither (6, 7, 1) nor (7, 1) occurred; (1,) did, after 9, followed by 6, 7.
    assert index.propose([*tokens, 1], 2) == [6, 7]
    assert NgramIndex(2, 3).propose([1, 2, 3, 4], 4) == []


def test_incremental_index_equals_a_fresh_one() -> None:
    rng = random.Random(3)
    tokens: list[int] = []
    grown = NgramIndex(2, 4)
    for _ in range(300):
        tokens.append(rng.randrange(6))
        assert grown.propose(tokens, 5) == NgramIndex(2, 4).propose(tokens, 5)


def test_a_bad_range_is_refused() -> None:
    with pytest.raises(ValueError, match="n_min"):
        NgramIndex(3, 2)


def test_recent_outputs_serve_other_requests_and_forget_the_oldest() -> None:
    recent = RecentOutputs(2, 3, max_tokens=12)
    recent.add([10, 11, 12, 13, 14, 15])
    assert recent.propose([1, 2, 11, 12], 3) == [13, 14, 15]
    recent.add([20, 21, 22, 23, 24, 25, 26, 27])  # 14 tokens > 12: the first one goes
    assert recent.num_tokens == 8
    assert recent.propose([1, 2, 11, 12], 3) == []
    assert recent.propose([21, 22], 2) == [23, 24]


def test_acceptance_learns_from_verifications() -> None:
    good, poor = Acceptance(), Acceptance()
    for _ in range(20):
        good.observe(4, 4)
        poor.observe(4, 0)
    assert good.rate > 0.9
    assert poor.rate < 0.1


def test_accepted_length_stops_at_the_first_mismatch() -> None:
    assert accepted_length([5, 6, 7], [5, 6]) == 2
    assert accepted_length([5, 9, 7], [5, 6]) == 1
    assert accepted_length([9], []) == 0
    with pytest.raises(ValueError):
        accepted_length([1, 2], [1, 2])


def _curve(ms_of_tokens: dict[int, float]) -> StepTimeCurve:
    curve = StepTimeCurve()
    for tokens, ms in ms_of_tokens.items():
        curve.observe(tokens, ms)
    return curve


def test_bandwidth_bound_steps_speculate_deeply() -> None:
    """Batch 1 on a model whose step time barely grows with tokens: every draft pays."""
    curve = _curve({1: 20.0, 2: 20.5, 4: 21.0, 8: 22.0})
    depths = choose_depths([Candidate(1, 4, 0.6)], base_tokens=1, base_yield=1, curve=curve)
    assert depths == {1: 4}


def test_compute_bound_steps_do_not_speculate() -> None:
    """48 decodes whose step time is proportional to its tokens: no draft pays."""
    curve = _curve({48: 48.0, 64: 64.0, 96: 96.0, 128: 128.0, 256: 256.0})
    candidates = [Candidate(k, 4, 0.7) for k in range(48)]
    assert choose_depths(candidates, base_tokens=48, base_yield=48, curve=curve) == {}


def test_depth_follows_acceptance_where_tokens_cost_something() -> None:
    """Tokens cost half of the average: drafts likely to be kept pay, unlikely ones not."""
    curve = _curve({8: 16.0, 16: 24.0, 32: 40.0, 64: 72.0})
    good = Candidate(1, 4, 0.9)
    poor = Candidate(2, 4, 0.3)
    depths = choose_depths([good, poor] + [Candidate(k, 0, 0.5) for k in range(3, 9)],
                           base_tokens=8, base_yield=8, curve=curve)
    assert depths.get(1, 0) >= 2
    assert depths.get(2, 0) == 0


def test_no_measurement_means_explore() -> None:
    assert choose_depths([Candidate(1, 3, 0.2)], 1, 1, StepTimeCurve()) == {1: 3}


def test_the_curve_interpolates_and_never_falls() -> None:
    curve = _curve({1: 10.0, 16: 20.0, 64: 15.0})
    assert curve.predict_ms(1) == 10.0
    assert curve.predict_ms(8.5) == pytest.approx(15.0)
    assert curve.predict_ms(64) == 20.0  # the quiet 64-token measurement is lifted
    assert curve.predict_ms(1000) == 20.0
    assert StepTimeCurve().predict_ms(5) is None


def test_a_draft_name_may_carry_its_quantization() -> None:
    from kvrelay_worker.engine.spec.draft_model import split_draft_quantization

    assert split_draft_quantization("smollm2-135m-instruct@int4") == (
        "smollm2-135m-instruct", "int4")
    assert split_draft_quantization("/models/a@b/m") == ("/models/a@b/m", "none")
    assert split_draft_quantization("m@int8") == ("m", "int8")
    assert split_draft_quantization("@int4") == ("@int4", "none")
