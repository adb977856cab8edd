"""Client-side validation: bad input fails early with ``InvalidRequest`` naming the argument."""

from __future__ import annotations

import math
from typing import Any

import pytest

import kvrelay
from kvrelay.protocol import ChatMessage, decode_request_json, encode_request
from kvrelay.request_builder import build_request


def build(prompt: str | None = "hi", **options: Any) -> Any:
    request, _settings = build_request(prompt, options, default_model="m")
    return request


def test_defaults() -> None:
    request = build()
    assert request.model == "m"
    assert request.prompt == "hi"
    assert len(request.job_id) == 32
    assert request.deadline is None
    assert request.sampling == kvrelay.protocol.SamplingOptions()
    assert decode_request_json(encode_request(request)) == request


def test_every_sampling_keyword_maps_to_the_wire() -> None:
    request = build(
        n=2,
        max_tokens=10,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        min_p=0.1,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        seed=7,
        stop=["a", "b"],
        stop_token_ids=[2],
        logprobs=3,
        ignore_eos=True,
        min_tokens=2,
        logit_bias={"5": -1.0, 6: 2},
    )
    s = request.sampling
    assert (s.n, s.max_tokens, s.temperature, s.top_p, s.top_k) == (2, 10, 0.5, 0.9, 40)
    assert (s.min_p, s.repetition_penalty, s.presence_penalty, s.frequency_penalty) == (
        0.1,
        1.1,
        0.5,
        -0.5,
    )
    assert (s.seed, s.stop, s.stop_token_ids, s.logprobs) == (7, ["a", "b"], [2], 3)
    assert (s.ignore_eos, s.min_tokens, s.logit_bias) == (True, 2, {5: -1.0, 6: 2.0})
    assert decode_request_json(encode_request(request)) == request


def test_every_wire_sampling_field_is_a_typed_keyword() -> None:
    """``GenerateOptions`` types the keywords for checkers; the wire struct defines them."""
    assert set(kvrelay.GenerateOptions.__annotations__) >= kvrelay.protocol.SAMPLING_FIELDS


def test_timeout_becomes_an_absolute_deadline() -> None:
    request, settings = build_request("x", {"timeout": 5}, default_model="m", now=1000.0)
    assert request.deadline == 1005.0
    assert request.enqueued_at == 1000.0
    assert settings.timeout == 5.0


def test_prompt_forms() -> None:
    assert build(None, messages=[ChatMessage(role="user", content="x")]).messages[0].content == "x"
    assert build(None, prompt_token_ids=(1, 2)).prompt_token_ids == [1, 2]


@pytest.mark.parametrize(
    ("prompt", "options", "match"),
    [
        (None, {}, "exactly one"),
        ("x", {"messages": [{"role": "user", "content": "y"}]}, "exactly one"),
        (None, {"messages": [], "prompt_token_ids": [1]}, "exactly one"),
        (5, {}, "prompt must be a str"),
        (None, {"messages": []}, "must not be empty"),
        (None, {"messages": "hello"}, "messages"),
        (None, {"messages": [{"role": "user"}]}, "content"),
        (None, {"messages": [{"role": "", "content": "x"}]}, "role"),
        (None, {"messages": [{"role": "u", "content": "x", "nick": "n"}]}, "unsupported"),
        (None, {"prompt_token_ids": []}, "must not be empty"),
        (None, {"prompt_token_ids": [1, -2]}, r"prompt_token_ids\[1\]"),
        (None, {"prompt_token_ids": [1, True]}, r"prompt_token_ids\[1\]"),
        ("x", {"n": 0}, "n: expected `int` >= 1, got 0"),
        ("x", {"n": True}, "n: expected `int`, got `bool`"),
        ("x", {"max_tokens": 0}, "max_tokens"),
        ("x", {"max_tokens": 1.5}, "max_tokens"),
        ("x", {"temperature": -0.1}, "temperature"),
        ("x", {"temperature": math.nan}, "temperature"),
        ("x", {"temperature": "hot"}, "temperature"),
        ("x", {"top_p": 0}, "top_p"),
        ("x", {"top_p": 1.5}, "top_p"),
        ("x", {"top_k": -2}, "top_k"),
        ("x", {"min_p": 2}, "min_p"),
        ("x", {"repetition_penalty": 0}, "repetition_penalty"),
        ("x", {"presence_penalty": 3}, "presence_penalty"),
        ("x", {"frequency_penalty": -3}, "frequency_penalty"),
        ("x", {"seed": 1.0}, "seed"),
        ("x", {"stop": 5}, "stop"),
        ("x", {"stop": ["ok", ""]}, r"stop\[1\]"),
        ("x", {"stop_token_ids": "12"}, "stop_token_ids"),
        ("x", {"logprobs": -1}, "logprobs"),
        ("x", {"ignore_eos": 1}, "ignore_eos"),
        ("x", {"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ("x", {"logit_bias": {"a": 1}}, "logit_bias"),
        ("x", {"logit_bias": {1: 500}}, "logit_bias"),
        ("x", {"logit_bias": [1]}, "logit_bias"),
        ("x", {"priority": "high"}, "priority"),
        ("x", {"timeout": 0}, "timeout"),
        ("x", {"timeout": -1}, "timeout"),
        ("x", {"stream_timeout": 0}, "stream_timeout"),
        ("x", {"cache_salt": 5}, "cache_salt"),
        ("x", {"job_id": "a{b}"}, "job_id"),
        ("x", {"job_id": "a b"}, "job_id"),
        ("x", {"job_id": ""}, "job_id"),
        ("x", {"model": ""}, "no model"),
    ],
)
def test_rejects(prompt: Any, options: dict[str, Any], match: str) -> None:
    with pytest.raises(kvrelay.InvalidRequest, match=match):
        build(prompt, **options)


def test_no_model_anywhere() -> None:
    with pytest.raises(kvrelay.InvalidRequest, match="no model"):
        build_request("x", {}, default_model=None)


def test_unknown_keyword_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="temprature"):
        build("x", temprature=1.0)


def test_payload_size_limit() -> None:
    with pytest.raises(kvrelay.PayloadTooLarge):
        build_request("x" * 2000, {}, default_model="m", max_payload_bytes=1000)
    assert build_request("x" * 500, {}, default_model="m", max_payload_bytes=1000)
    assert issubclass(kvrelay.PayloadTooLarge, kvrelay.InvalidRequest)
