"""One request that breaks an engine step fails alone; the requests beside it go on.

The hostile requests here are real ones: ``top_k = 2**63`` passes the type checks but
cannot be put in the int64 tensor the sampler builds (issue 16's example), and a request
whose options are changed after admission, or whose token is outside the vocabulary,
makes the sampler or the model itself raise inside ``step()``. Before failure isolation
any of them made ``step()`` raise for the whole batch.

Then a property: whatever valid-typed, extreme-valued sampling options the requests
beside it carry (huge and tiny floats, top_k past int64, bias on token ids outside the
vocabulary, seeds at the ends of their range), a greedy canary completes exactly as it
does alone, and no block leaks. Each such request is refused at admission with a typed
error, or runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.engine_run import assert_engine_idle, one_torch_thread, run_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvrelay_worker.engine import (
    LLM,
    EngineInputError,
    LLMEngine,
    RequestFailedError,
    SamplingParams,
    SamplingParamsError,
)

LONG = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
LONG_PROMPT = [5, 17, 300, 42, 9, 1000, 77]
HOSTILE_PROMPT = [11, 12, 13]

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
                  num_kv_blocks=64, max_model_len=256).engine


@pytest.fixture(scope="module")
def alone(engine: LLMEngine) -> list[int]:
    """The long greedy request's tokens when it runs by itself."""
    engine.add_request("alone", LONG_PROMPT, LONG)
    outputs = run_engine(engine)
    final = outputs["alone"][-1].output
    assert final is not None
    assert len(final.token_ids) == 40
    return final.token_ids


def long_tokens(outputs: dict[str, list], request_id: str = "long") -> list[int]:
    steps = outputs[request_id]
    assert all(s.error is None for s in steps)
    final = steps[-1].output
    assert final is not None
    return final.token_ids


def test_top_k_past_int64_is_refused_at_admission(engine: LLMEngine, alone: list[int]) -> None:
    engine.add_request("long", LONG_PROMPT, LONG)
    engine.step()  # the long request is running when the hostile one arrives
    # Refused by SamplingParams' bound, or (before that bound) by the admission check
    # that builds the request's sampling row; either way before it reaches a step.
    with pytest.raises(SamplingParamsError):
        engine.add_request("hostile", HOSTILE_PROMPT,
                           SamplingParams(temperature=1.0, top_k=2**63, max_tokens=20))
    outputs = run_engine(engine)
    assert long_tokens(outputs) == alone
    assert "hostile" not in outputs
    assert_engine_idle(engine)


def test_a_sampling_row_that_breaks_the_step_fails_only_its_request(
        engine: LLMEngine, alone: list[int]) -> None:
    hostile = SamplingParams(temperature=1.0, max_tokens=20)
    engine.add_request("long", LONG_PROMPT, LONG)
    engine.add_request("hostile", HOSTILE_PROMPT, hostile)
    engine.add_request("bystander", [400, 401], SamplingParams(temperature=0.0, max_tokens=5))
    for _ in range(3):
        engine.step()
    # Past admission, as a bug in admission checks would let through: the sampler's
    # int64 top-k tensor cannot hold it, so building the step's sampling rows raises.
    hostile.top_k = 2**63
    outputs = run_engine(engine)
    errors = [s.error for s in outputs["hostile"] if s.error is not None]
    assert len(errors) == 1
    assert isinstance(errors[0], RequestFailedError)
    assert outputs["hostile"][-1].finished
    assert "Overflow" in str(errors[0]) or "overflow" in str(errors[0])
    assert long_tokens(outputs) == alone
    assert outputs["bystander"][-1].output is not None
    assert_engine_idle(engine)


def test_a_token_the_model_cannot_embed_fails_only_its_request(
        engine: LLMEngine, alone: list[int]) -> None:
    engine.add_request("long", LONG_PROMPT, LONG)
    engine.add_request("hostile", HOSTILE_PROMPT, SamplingParams(temperature=0.0, max_tokens=5))
    # Corrupt the queued sequence itself: the model's embedding lookup raises on it, so
    # the failure is in the forward pass, not the sampler.
    engine.requests["hostile"].choices[0].seq.token_ids[-1] = engine.vocab_size + 7
    outputs = run_engine(engine)
    assert isinstance(outputs["hostile"][-1].error, RequestFailedError)
    assert long_tokens(outputs) == alone
    assert_engine_idle(engine)


def test_every_choice_of_a_failing_request_ends(engine: LLMEngine, alone: list[int]) -> None:
    hostile = SamplingParams(temperature=1.0, max_tokens=10, n=3)
    engine.add_request("hostile", HOSTILE_PROMPT, hostile)
    engine.add_request("long", LONG_PROMPT, LONG)
    engine.step()
    hostile.top_k = 2**63
    outputs = run_engine(engine)
    final = outputs["hostile"][-1]
    assert final.finished
    assert isinstance(final.error, RequestFailedError)
    assert final.output is not None
    assert [c.finish_reason for c in final.output.choices] == ["abort"] * 3
    assert long_tokens(outputs) == alone
    assert_engine_idle(engine)


def test_the_offline_api_raises_the_typed_error(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=10)
    engine.add_request("poisoned", HOSTILE_PROMPT, params)
    params.top_k = 2**63
    with pytest.raises(RequestFailedError, match="failed on this request"):
        LLM.from_engine(engine)._run(["poisoned"], use_tqdm=False)
    assert_engine_idle(engine)


# ---------------------------------------------------------------- property


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
