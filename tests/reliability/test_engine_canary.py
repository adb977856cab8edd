"""Property: whatever valid-typed, extreme-valued sampling options the requests beside it
carry, a greedy canary request completes exactly as it does alone, and no block leaks.

Options are drawn at the edges of what the types allow (huge and tiny floats, top_k past
int64, bias on token ids outside the vocabulary, seeds at the ends of their range). Each
hostile request is either refused at admission with a typed error, or runs; either way
the canary's tokens do not change. Before failure isolation, a ``top_k >= 2**63``
request accepted beside the canary made every step raise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.engine_run import assert_engine_idle, one_torch_thread, run_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvrelay_worker.engine import LLM, EngineInputError, LLMEngine, SamplingParams

VOCAB = 49152
CANARY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
CANARY_PROMPT = [7, 300, 1234, 42, 8, 99]

huge_ints = st.sampled_from([0, 1, -1, VOCAB - 1, VOCAB, 2**31, 2**62, 2**63 - 1, 2**63,
                             2**64, 2**100])
extreme_floats = st.sampled_from([0.0, 5e-324, 1e-300, 1e-30, 1e-6, 0.5, 1.0, 2.0, 1e6,
                                  1e30, 1e308, -1e-300, -2.0])
token_ids = st.one_of(st.integers(0, VOCAB - 1), huge_ints)

options = st.fixed_dictionaries({}, optional={
    "n": st.integers(1, 3),
    "max_tokens": st.integers(1, 8),
    "temperature": extreme_floats,
    "top_p": extreme_floats,
    "top_k": huge_ints,
    "min_p": extreme_floats,
    "repetition_penalty": extreme_floats,
    "presence_penalty": extreme_floats,
    "frequency_penalty": extreme_floats,
    "logit_bias": st.dictionaries(token_ids, extreme_floats, max_size=4),
    "seed": st.one_of(st.none(), huge_ints, st.sampled_from([-2**63, -2**64])),
    "logprobs": st.sampled_from([None, 0, 1, 20]),
    "min_tokens": st.integers(0, 8),
    "stop": st.sampled_from([None, "a", ["\x00", "\U0010ffff"], "x" * 200]),
    "stop_token_ids": st.lists(token_ids, max_size=3),
    "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(),
})
hostile_prompts = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40)


@pytest.fixture(scope="module")
def engine(tiny_model: Callable[[str], Path]) -> Iterator[LLMEngine]:
    with one_torch_thread():
        yield LLM(str(tiny_model("llama-mqa")), device="cpu", dtype="float32",
                  num_kv_blocks=48, max_model_len=128).engine


@pytest.fixture(scope="module")
def canary_alone(engine: LLMEngine) -> list[int]:
    engine.add_request("canary", CANARY_PROMPT, CANARY)
    final = run_engine(engine)["canary"][-1].output
    assert final is not None
    assert len(final.token_ids) == 12
    return final.token_ids


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(hostiles=st.lists(st.tuples(options, hostile_prompts), min_size=1, max_size=3))
def test_the_canary_is_unharmed(engine: LLMEngine, canary_alone: list[int],
                                hostiles: list[tuple[dict[str, Any], list[int]]]) -> None:
    engine.add_request("canary", CANARY_PROMPT, CANARY)
    for i, (opts, prompt) in enumerate(hostiles):
        try:
            params = SamplingParams(**opts)
            engine.add_request(f"hostile-{i}", prompt, params)
        except EngineInputError:
            pass  # refused with a typed error: allowed, and nothing was queued
    outputs = run_engine(engine, max_steps=500)
    final = outputs["canary"][-1]
    assert final.error is None
    assert final.output is not None
    assert final.output.token_ids == canary_alone
    assert_engine_idle(engine)
