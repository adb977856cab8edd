"""Every request field of the installed ``openai`` package's chat-completions and
completions types is classified by ``kvrelay.gateway.fields``: honoured (it changes what
the gateway asks of the SDK), a no-op (it changes nothing), or refused with a 400 naming
it. Refusals and unknown fields are sent to a real gateway with the real ``openai``
client; docs/http-api.md's tables are the module's own."""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest
from helpers.gateway_process import GatewayProcess
from helpers.readme_tables import doc_text
from helpers.redis_db import fresh_db_url
from openai.types import completion_create_params as text_params
from openai.types.chat import completion_create_params as chat_params

from kvrelay.gateway.fields import (
    CHAT,
    CHAT_ENDPOINT,
    TEXT,
    TEXT_ENDPOINT,
    Handling,
    Rule,
    markdown_table,
)
from kvrelay.gateway.requests import ChatRequest, CompletionRequest

pytestmark = pytest.mark.integration

DB = 14  # a database of this module's own on the test Redis: no worker serves it
MODEL = "m"
ASK = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather",
                                            "parameters": {"type": "object"}}}


def openai_fields(params: Any) -> set[str]:
    """The fields of ``CompletionCreateParamsBase``, plus ``stream`` (on its subclasses)."""
    return set(typing.get_type_hints(params.CompletionCreateParamsBase)) | {"stream"}


ENDPOINTS: dict[str, tuple[Mapping[str, Rule], type[Any], set[str], dict[str, Any]]] = {
    CHAT_ENDPOINT: (CHAT, ChatRequest, openai_fields(chat_params),
                    {"model": MODEL, "messages": ASK}),
    TEXT_ENDPOINT: (TEXT, CompletionRequest, openai_fields(text_params),
                    {"model": MODEL, "prompt": "hi"}),
}

# A value asking for something, per field (and the fields it needs beside it).
SAMPLES: dict[str, Any] = {
    "model": "other", "messages": [{"role": "user", "content": "other"}], "prompt": "other",
    "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 7,
    "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.5, "n": 2, "stop": "x",
    "seed": 1, "presence_penalty": 1.0, "frequency_penalty": 1.0, "logit_bias": {"5": 1.0},
    "tools": [WEATHER], "tool_choice": "none", "parallel_tool_calls": False,
    "reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False},
    "response_format": {"type": "json_object"}, "guided_json": {"type": "object"},
    "guided_regex": "a+", "guided_choice": ["a"], "top_k": 5, "min_p": 0.1,
    "repetition_penalty": 1.1, "min_tokens": 1, "ignore_eos": True, "priority": 1,
    "stop_token_ids": [1], "return_tokens_as_token_ids": True, "resumable": True,
    "speculative": False, "echo": True, "best_of": 2,
    # no-ops
    "user": "u", "metadata": {"k": "v"}, "safety_identifier": "s", "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    # refused
    "store": True, "prompt_cache_options": {"mode": "explicit"}, "service_tier": "flex",
    "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "mp3"},
    "prediction": {"type": "content", "content": "x"}, "verbosity": "low",
    "web_search_options": {}, "moderation": {"model": "omni-moderation-latest"},
    "functions": [{"name": "f"}], "function_call": "auto", "suffix": "x",
}
# Fields whose sample needs another beside it (the other's value is the baseline too).
NEEDS: dict[tuple[str, str], dict[str, Any]] = {
    (CHAT_ENDPOINT, "logprobs"): {}, (CHAT_ENDPOINT, "top_logprobs"): {"logprobs": True},
    (TEXT_ENDPOINT, "logprobs"): {},
}
SAMPLES_BY_ENDPOINT = {(CHAT_ENDPOINT, "logprobs"): True, (CHAT_ENDPOINT, "top_logprobs"): 2,
                       (TEXT_ENDPOINT, "logprobs"): 2}


def sample(endpoint: str, name: str) -> Any:
    return SAMPLES_BY_ENDPOINT.get((endpoint, name), SAMPLES.get(name))


def cases(handling: Handling) -> list[tuple[str, str]]:
    return [(endpoint, name) for endpoint, (rules, *_) in ENDPOINTS.items()
            for name, rule in rules.items() if rule.handling is handling]


def wiring(endpoint: str, body: dict[str, Any]) -> Any:
    """Everything the gateway takes from a body: the SDK keywords and the answer's form."""
    _, kind, _, _ = ENDPOINTS[endpoint]
    request = msgspec.json.decode(msgspec.json.encode(body), type=kind)
    return (msgspec.to_builtins(request.options()), request.output_form(), request.stream,
            request.resumable, request.model)


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_every_openai_field_is_classified_and_declared(endpoint: str) -> None:
    rules, kind, fields, _ = ENDPOINTS[endpoint]
    assert fields - set(rules) == set(), "fields of the openai package nobody classified"
    assert set(kind.__struct_fields__) == set(rules), "the struct declares what is classified"


@pytest.mark.parametrize(("endpoint", "name"), cases(Handling.HONOURED))
def test_an_honoured_field_changes_what_the_gateway_asks(endpoint: str, name: str) -> None:
    _, _, _, base = ENDPOINTS[endpoint]
    base = {**base, **NEEDS.get((endpoint, name), {})}
    assert sample(endpoint, name) is not None, f"no sample value for {name}"
    assert wiring(endpoint, {**base, name: sample(endpoint, name)}) != wiring(endpoint, base)


@pytest.mark.parametrize(("endpoint", "name"), cases(Handling.NO_OP))
def test_a_no_op_field_changes_nothing(endpoint: str, name: str) -> None:
    _, _, _, base = ENDPOINTS[endpoint]
    assert sample(endpoint, name) is not None, f"no sample value for {name}"
    assert wiring(endpoint, {**base, name: sample(endpoint, name)}) == wiring(endpoint, base)


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_the_docs_tables_are_the_classification(endpoint: str) -> None:
    assert markdown_table(endpoint) in doc_text("http-api.md")


# ------------------------------------------------------------------ a real gateway


@pytest.fixture(scope="module")
def api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    gateway = GatewayProcess(fresh_db_url(redis_url, DB),
                             Path(tmp_path_factory.mktemp("fields-gateway"))).start()
    try:
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                           timeout=30) as client:
            yield client
    finally:
        gateway.stop()


def send(api: openai.OpenAI, endpoint: str, fields: dict[str, Any]) -> Any:
    """Create with ``fields`` as the openai package's own keywords where it has them."""
    _, _, known, base = ENDPOINTS[endpoint]
    create = api.chat.completions.create if endpoint == CHAT_ENDPOINT \
        else api.completions.create
    own = {k: v for k, v in fields.items() if k in known}
    extra = {k: v for k, v in fields.items() if k not in known}
    return create(**{**base, **own}, extra_body=extra or None)


@pytest.mark.parametrize(("endpoint", "name"), cases(Handling.REFUSED))
def test_a_refused_field_is_a_400_naming_it(api: openai.OpenAI, endpoint: str,
                                            name: str) -> None:
    value = sample(endpoint, name)
    assert value is not None, f"no sample value for {name}"
    with pytest.raises(openai.BadRequestError) as refused:
        send(api, endpoint, {name: value})
    assert refused.value.param == name
    assert name in refused.value.message
    rules, *_ = ENDPOINTS[endpoint]
    for inert in rules[name].inert:
        if inert is not None:  # asks for nothing: past the checks, to "no worker" (503)
            with pytest.raises(openai.InternalServerError):
                send(api, endpoint, {name: inert})


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_an_unknown_field_is_a_400_naming_it(api: openai.OpenAI, endpoint: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        send(api, endpoint, {"frobnicate": 1})
    assert refused.value.param == "frobnicate"
    assert "frobnicate: unknown field" in refused.value.message
    with pytest.raises(openai.BadRequestError) as nested:
        send(api, endpoint, {"stream_options": {"include_usage": True, "colour": "red"}})
    assert nested.value.param == "stream_options.colour"


@pytest.mark.parametrize(("endpoint", "name"), cases(Handling.NO_OP))
def test_a_no_op_field_is_accepted(api: openai.OpenAI, endpoint: str, name: str) -> None:
    with pytest.raises(openai.InternalServerError):  # past the checks, to "no worker" (503)
        send(api, endpoint, {name: sample(endpoint, name)})
