"""Bad input raises a ``ValueError`` subclass with a clear message, and harms nothing.

Each bad request is refused before anything is queued: an engine with requests in flight
keeps serving them, token for token as if the bad requests had never been tried.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from helpers.engine_run import (
    assert_engine_idle,
    final_outputs,
    run_engine,
)

from kvrelay.protocol import GenerateRequest
from kvrelay_worker.engine import (
    LLM,
    EngineConfigError,
    EngineInputError,
    InvalidPromptError,
    LLMEngine,
    PromptTooLongError,
    SamplingParams,
    SamplingParamsError,
)
from kvrelay_worker.intake.job_request import JobRejected, prompt_ids_for
from kvrelay_worker.models.errors import UnknownModelError

VOCAB = 49152
MAX_MODEL_LEN = 128


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def engine(folder: str) -> LLMEngine:
    """Shared: every test leaves it idle (and checks that it does)."""
    return LLM(folder, device="cpu", dtype="float32", num_kv_blocks=32,
               max_model_len=MAX_MODEL_LEN).engine


# ------------------------------------------------------------------ sampling params


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_tokens": -1}, "max_tokens: expected `int` >= 0, got -1"),
        ({"max_tokens": 0}, "max_tokens may be 0 only with prompt_logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs: expected `int` <= 20, got 21"),
        ({"top_p": 1.5}, "top_p: expected `float` <= 1.0, got 1.5"),
        ({"top_p": 0.0}, "top_p: expected `float` > 0.0, got 0.0"),
        ({"temperature": -0.5}, "temperature: expected `float` >= 0.0, got -0.5"),
        ({"temperature": float("nan")}, "temperature: must be a finite number, got nan"),
        ({"n": 0}, "n: expected `int` >= 1, got 0"),
        ({"n": 1.5}, "n: expected `int`, got `float`"),
        ({"logprobs": 21}, "logprobs: expected `int` <= 20, got 21"),
        ({"logprobs": -1}, "logprobs: expected `int` >= 0, got -1"),
        ({"top_k": -2}, "top_k: expected `int` >= -1, got -2"),
        ({"min_p": 1.5}, "min_p: expected `float` <= 1.0, got 1.5"),
        ({"repetition_penalty": 0.0}, "repetition_penalty: expected `float` > 0.0, got 0.0"),
        ({"presence_penalty": 3.0}, "presence_penalty: expected `float` <= 2.0, got 3.0"),
        ({"frequency_penalty": -2.5}, "frequency_penalty: expected `float` >= -2.0, got -2.5"),
        ({"seed": 1 << 64}, "seed: expected `int` <= 9223372036854775807"),
        ({"min_tokens": 5, "max_tokens": 3}, "min_tokens (5) must not exceed max_tokens (3)"),
        ({"stop": 123}, "stop: expected `array`, got `int`"),
        ({"stop": {"a": 1}}, "stop: expected `array`, got `object`"),
        ({"stop": b"END"}, "stop: expected `array`, got `bytes`"),
        ({"stop": ["ok", 7]}, "stop[1]: expected `str`, got `int`"),
        ({"stop": [""]}, "stop[0]: expected `str` of length >= 1"),
        ({"stop_token_ids": 5}, "stop_token_ids: expected `array`, got `int`"),
        ({"stop_token_ids": ["a"]}, "stop_token_ids[0]: expected `int`, got `str`"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]: expected `int` >= 0"),
        ({"logit_bias": {"a": 1.0}}, "logit_bias key: expected `int`, got `str`"),
        ({"logit_bias": {5: float("inf")}}, "logit_bias[...]: expected `float` <= 100.0"),
        ({"logit_bias": [1, 2]}, "logit_bias: expected `object`, got `array`"),
    ],
)
def test_bad_sampling_params_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**options)
    assert isinstance(info.value, ValueError)
    assert message in str(info.value)


def test_good_edge_values_are_accepted() -> None:
    params = SamplingParams(top_p=1.0, temperature=0, n=128, logprobs=20, top_k=-1,
                            stop=["a", "b"], stop_token_ids=[1, 2], max_tokens=None)
    assert params.stop_strings == ("a", "b")
    assert params.stop_token_ids == [1, 2]
    assert SamplingParams(stop="END").stop_strings == ("END",)


# ------------------------------------------------------------------ requests


BAD_PROMPTS: list[tuple[Any, type[EngineInputError], str]] = [
        ("", InvalidPromptError, "the prompt is empty"),
        ([], InvalidPromptError, "the prompt is empty"),
        ([1, 2, VOCAB], InvalidPromptError, f"token id {VOCAB} is outside the vocabulary"),
        ([1, -3], InvalidPromptError, "token id -3 is outside the vocabulary"),
        ([1, "2"], InvalidPromptError, "prompt token ids must be integers, got '2'"),
        ([1, True], InvalidPromptError, "prompt token ids must be integers, got True"),
        (list(range(100, 100 + MAX_MODEL_LEN)), PromptTooLongError,
         f"the prompt has {MAX_MODEL_LEN} tokens; max_model_len is {MAX_MODEL_LEN}"),
        (" word" * 400, PromptTooLongError, f"max_model_len is {MAX_MODEL_LEN}"),
]


@pytest.mark.parametrize(("prompt", "kind", "message"), BAD_PROMPTS)
def test_bad_prompts_are_refused(engine: LLMEngine, prompt: Any, kind: type[Exception],
                                 message: str) -> None:
    with pytest.raises(kind) as info:
        engine.add_request("bad", prompt, SamplingParams())
    assert isinstance(info.value, EngineInputError)
    assert message in str(info.value)
    assert_engine_idle(engine)
    assert engine.step() == []


@pytest.mark.parametrize(("prompt", "kind", "message"), BAD_PROMPTS)
def test_the_worker_refuses_the_same_prompts_with_the_same_words(
        engine: LLMEngine, prompt: Any, kind: type[Exception], message: str) -> None:
    """One prompt check serves both doors: the worker's task thread and ``add_request``."""
    form = {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}
    request = GenerateRequest(job_id="j", model="m", **form)
    with pytest.raises(JobRejected) as info:
        prompt_ids_for(request, engine.tokenizer, engine.vocab_size, engine.max_model_len)
    expected_code = "prompt_too_long" if kind is PromptTooLongError else "invalid_request"
    assert info.value.code == expected_code
    assert message in info.value.message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"params": SamplingParams(stop_token_ids=[VOCAB + 5])},
         f"stop token id {VOCAB + 5} is outside the vocabulary"),
        ({"prior_outputs": [[5, VOCAB]]}, "prior output has a token outside the vocabulary"),
        ({"params": SamplingParams(n=2), "prior_outputs": [[5], [6]],
          "prior_finish_reasons": [None, "exploded"]},
         "prior finish reason 'exploded' is not one of"),
    ],
)
def test_bad_request_options_are_refused(engine: LLMEngine, kwargs: dict[str, Any],
                                         message: str) -> None:
    params = kwargs.pop("params", SamplingParams())
    with pytest.raises(InvalidPromptError) as info:
        engine.add_request("bad", [10, 11, 12], params, **kwargs)
    assert message in str(info.value)
    assert_engine_idle(engine)


def test_params_must_be_sampling_params(engine: LLMEngine) -> None:
    with pytest.raises(TypeError, match="params must be SamplingParams, got dict"):
        engine.add_request("bad", [10, 11], {"max_tokens": 3})  # type: ignore[arg-type]


def test_duplicate_request_id_is_refused(engine: LLMEngine) -> None:
    engine.add_request("same", [10, 11], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="request id 'same' is already in the engine"):
        engine.add_request("same", [12, 13], SamplingParams(max_tokens=2))
    finals = final_outputs(run_engine(engine))
    assert finals["same"].prompt_token_ids == [10, 11]
    assert_engine_idle(engine)


def test_shorter_prior_texts_mean_nothing_was_reported(engine: LLMEngine) -> None:
    """Fewer prior texts than prior outputs: the missing choices reported no text yet."""
    params = SamplingParams(n=2, max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_request("resumed", [10, 11, 12], params, prior_outputs=[[500], [600]],
                       prior_texts=["x"])
    out = final_outputs(run_engine(engine))["resumed"]
    assert [len(c.token_ids) for c in out.choices] == [4, 4]
    assert_engine_idle(engine)


# ------------------------------------------------------------------ models and config


def test_unknown_model_name() -> None:
    with pytest.raises(UnknownModelError) as info:
        LLM("no-such-model", device="cpu")
    assert isinstance(info.value, ValueError)
    text = str(info.value)
    assert "unknown model 'no-such-model'" in text
    assert "smollm2-135m-instruct" in text  # says what would work


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"block_size": 12}, "block_size must be one of 8, 16, 32, 64, 128"),
        ({"dtype": "int3"}, "unknown dtype 'int3'"),
        ({"device": "mps"}, "device must be cpu or cuda, got 'mps'"),
        ({"num_kv_blocks": 2, "max_model_len": 64},
         "the KV pool holds 32 tokens (2 blocks), fewer than max_model_len=64"),
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 32,
          "max_model_len": 64},
         "with chunked prefill off, max_num_batched_tokens (32) must be at least "
         "max_model_len (64)"),
        ({"target_step_ms": 0}, "target_step_ms must be a positive, finite number"),
        ({"target_step_ms": -5.0}, "target_step_ms must be a positive, finite number"),
        ({"target_step_ms": float("nan")}, "target_step_ms must be a positive, finite number"),
        ({"target_step_ms": float("inf")}, "target_step_ms must be a positive, finite number"),
        ({"target_step_ms": 50.0, "enable_chunked_prefill": False},
         "target_step_ms sizes prompt chunks: it needs enable_chunked_prefill=True"),
        ({"target_step_ms": 50.0, "min_prefill_chunk": 0},
         "min_prefill_chunk must be at least 1, got 0"),
    ],
)
def test_bad_engine_options(folder: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(EngineConfigError) as info:
        LLM(folder, **{"device": "cpu", "dtype": "float32", **options})
    assert message in str(info.value)


def test_without_chunked_prefill_long_prompts_are_refused_not_queued(folder: str) -> None:
    """A prompt longer than one step's budget could never run without chunking."""
    llm = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=32,
              enable_chunked_prefill=False, max_num_batched_tokens=48)
    engine = llm.engine
    assert engine.max_model_len == 48
    with pytest.raises(PromptTooLongError, match="max_model_len is 48"):
        engine.add_request("long", list(range(100, 160)), SamplingParams(max_tokens=2))
    out = llm.generate([list(range(100, 140))],
                       SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(out[0].token_ids) == 4
    assert_engine_idle(engine)


# ------------------------------------------------------------------ engine keeps serving


GOOD = {
    "greedy": ([100, 200, 300, 400, 500], SamplingParams(max_tokens=10, temperature=0.0,
                                                         ignore_eos=True)),
    "seeded": (list(range(2000, 2040)), SamplingParams(max_tokens=10, temperature=0.8,
                                                        seed=7, ignore_eos=True)),
    "pair": ([7, 8, 9] * 7, SamplingParams(n=2, max_tokens=8, temperature=1.0, seed=3,
                                           ignore_eos=True)),
}


def _bad_requests(engine: LLMEngine) -> list[Callable[[], object]]:
    return [
        lambda: engine.add_request("bad-empty", "", SamplingParams()),
        lambda: engine.add_request("bad-long", list(range(MAX_MODEL_LEN + 5)), SamplingParams()),
        lambda: engine.add_request("bad-vocab", [1, VOCAB + 1], SamplingParams()),
        lambda: engine.add_request("greedy", [1, 2], SamplingParams()),  # duplicate id
        lambda: engine.add_request("bad-stop", [1, 2], SamplingParams(stop_token_ids=[VOCAB])),
        lambda: engine.add_request("bad-prior", [1, 2], SamplingParams(n=3),
                                   prior_outputs=[[1], [2], [3]],
                                   prior_finish_reasons=[None, None, "bogus"]),
        lambda: engine.add_request("bad-params", [1, 2], SamplingParams(max_tokens=-1)),
        lambda: engine.add_request("bad-top-p", [1, 2], SamplingParams(top_p=2.0)),
    ]


def _tokens(engine: LLMEngine, interrupt: bool) -> dict[str, list[list[int]]]:
    for request_id, (prompt, params) in GOOD.items():
        engine.add_request(request_id, prompt, params)
    outputs: dict[str, list[Any]] = {}
    for _ in range(3):
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    if interrupt:
        before = engine.stats()
        for attempt in _bad_requests(engine):
            with pytest.raises(ValueError):
                attempt()
        after = engine.stats()
        for key in ("running", "waiting", "requests", "free_blocks"):
            assert after[key] == before[key], key
        assert set(engine.requests) == set(GOOD)
    for request_id, steps in run_engine(engine).items():
        outputs.setdefault(request_id, []).extend(steps)
    finals = final_outputs(outputs)
    assert set(finals) == set(GOOD)
    assert_engine_idle(engine)
    return {rid: [c.token_ids for c in out.choices] for rid, out in finals.items()}


def test_engine_keeps_serving_requests_in_flight(folder: str) -> None:
    def make() -> LLMEngine:
        return LLM(folder, device="cpu", dtype="float32", num_kv_blocks=32,
                   max_model_len=MAX_MODEL_LEN).engine

    undisturbed = _tokens(make(), interrupt=False)
    assert _tokens(make(), interrupt=True) == undisturbed


def test_generate_with_one_bad_prompt_leaves_the_engine_clean(folder: str) -> None:
    llm = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=32,
              max_model_len=MAX_MODEL_LEN)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    with pytest.raises(InvalidPromptError, match="outside the vocabulary"):
        llm.generate([[10, 11, 12], [13, 14], [15, VOCAB]], params)
    assert_engine_idle(llm.engine)
    # And it still works.
    (out,) = llm.generate([[10, 11, 12]], params)
    assert len(out.token_ids) == 3
