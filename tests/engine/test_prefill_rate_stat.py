"""The engine reports the prefill rate its own steps measured (``prefill_tokens_per_s``):
nothing before a prompt was computed, a finite positive rate after."""

from __future__ import annotations

import math

import pytest
from helpers.engine_run import run_engine

from kvrelay_worker.engine import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_engine_reports_the_prefill_rate_of_its_steps(folder: str) -> None:
    engine = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=32,
                 max_model_len=256).engine
    assert engine.stats()["prefill_tokens_per_s"] == 0.0
    engine.add_request("a", list(range(1, 41)), SamplingParams(max_tokens=3))
    run_engine(engine)
    rate = engine.stats()["prefill_tokens_per_s"]
    assert rate > 0.0
    assert math.isfinite(rate)
