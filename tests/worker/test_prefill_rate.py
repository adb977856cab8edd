"""The engines' measured prefill rate (what the takeover throttle sizes its budget by):
prompt tokens over the time of the steps that computed them, the latest steps only."""

from __future__ import annotations

import pytest

from kvrelay_worker.engine.prefill_rate import PrefillRate
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.simulated.engine import SimulatedEngine
from kvrelay_worker.simulated.step_time import StepTimeModel


def test_the_prefill_rate_is_prompt_tokens_over_the_time_of_the_steps_that_had_them() -> None:
    rate = PrefillRate(window=2)
    assert rate.tokens_per_s() == 0.0
    rate.observe(0, 0.5)  # a decode-only step teaches nothing
    rate.observe(100, 0.0)  # nor a step without a usable time
    assert rate.tokens_per_s() == 0.0
    rate.observe(100, 0.5)
    rate.observe(300, 0.5)
    assert rate.tokens_per_s() == pytest.approx(400.0)
    rate.observe(50, 0.5)  # the oldest step leaves the window
    assert rate.tokens_per_s() == pytest.approx(350.0)


def test_the_simulated_engine_reports_its_prefill_rate_from_its_step_time_model() -> None:
    slept: list[float] = []
    engine = SimulatedEngine(StepTimeModel(step_ms=20.0, token_ms=2.0), sleep=slept.append,
                             clock=lambda: 100.0)
    engine.add_request("a", [1] * 90, SamplingParams(max_tokens=3))
    engine.step()  # the whole prompt: 20 ms + 90 x 2 ms
    assert engine.stats()["prefill_tokens_per_s"] == pytest.approx(90 / 0.2)
    engine.step()  # a decode step leaves the rate as it was
    assert engine.stats()["prefill_tokens_per_s"] == pytest.approx(90 / 0.2)
