"""Every field of the installed ``openai`` package's Responses request types (the body, and
the tools, items, content parts, ``text`` and ``reasoning`` inside it) is classified by
``kvrelay.gateway.responses_api.fields``: honoured (it changes what the gateway asks of
the SDK), a no-op (it changes nothing), or refused with a 400 naming it. Refusals and
unknown fields are sent to a real gateway with the real ``openai`` client; docs/http-api.md's
table is the module's own."""

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
from openai.types.responses import (
    easy_input_message_param,
    function_tool_param,
    response_create_params,
    response_format_text_json_schema_config_param,
    response_function_tool_call_param,
    response_input_item_param,
    response_input_text_content_param,
    response_input_text_param,
    response_output_message_param,
    response_output_refusal_param,
    response_output_text_param,
    response_reasoning_item_param,
    response_text_config_param,
    tool_choice_allowed_param,
    tool_choice_function_param,
)
from openai.types.shared_params import reasoning, response_format_json_object

from kvrelay.gateway.errors import GatewayError
from kvrelay.gateway.responses_api import fields
from kvrelay.gateway.responses_api.fields import EXTRAS, REQUEST, Handling, Rule, markdown_table
from kvrelay.gateway.responses_api.request import parse_request

pytestmark = pytest.mark.integration

DB = 13  # a database of this module's own on the test Redis: no worker serves it
BASE: dict[str, Any] = {"model": "m", "input": "hi"}
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"},
           "strict": True}


def keys(*typed_dicts: Any) -> set[str]:
    return set().union(*(typing.get_type_hints(t) for t in typed_dicts))


OPENAI_FIELDS = keys(response_create_params.ResponseCreateParamsBase,
                     response_create_params.ResponseCreateParamsStreaming)


# Each classification, and the openai types whose fields it must cover.
NESTED: list[tuple[Mapping[str, Rule], set[str]]] = [
    (fields.FUNCTION_TOOL, keys(function_tool_param.FunctionToolParam)),
    (fields.TEXT, keys(response_text_config_param.ResponseTextConfigParam)),
    (fields.TEXT_FORMAT, keys(
        response_format_text_json_schema_config_param.ResponseFormatTextJSONSchemaConfigParam,
        response_format_json_object.ResponseFormatJSONObject)),
    (fields.REASONING, keys(reasoning.Reasoning)),
    (fields.TOOL_CHOICE_FUNCTION, keys(tool_choice_function_param.ToolChoiceFunctionParam)),
    (fields.TOOL_CHOICE_ALLOWED, keys(tool_choice_allowed_param.ToolChoiceAllowedParam)),
    (fields.ITEMS["message"], keys(easy_input_message_param.EasyInputMessageParam,
                                   response_input_item_param.Message,
                                   response_output_message_param.ResponseOutputMessageParam)),
    (fields.ITEMS["function_call"],
     keys(response_function_tool_call_param.ResponseFunctionToolCallParam)),
    (fields.ITEMS["function_call_output"], keys(response_input_item_param.FunctionCallOutput)),
    (fields.ITEMS["reasoning"], keys(response_reasoning_item_param.ResponseReasoningItemParam)),
    (fields.PARTS["input_text"], keys(
        response_input_text_param.ResponseInputTextParam,
        response_input_text_content_param.ResponseInputTextContentParam)),
    (fields.PARTS["output_text"], keys(response_output_text_param.ResponseOutputTextParam)),
    (fields.PARTS["refusal"], keys(response_output_refusal_param.ResponseOutputRefusalParam)),
    (fields.REASONING_PARTS["summary_text"], keys(response_reasoning_item_param.Summary)),
    (fields.REASONING_PARTS["reasoning_text"], keys(response_reasoning_item_param.Content)),
]

# A value asking for something, per body field (and the fields it needs beside it).
SAMPLES: dict[str, Any] = {
    "model": "other", "input": "other", "instructions": "Be brief.", "tools": [WEATHER],
    "tool_choice": "none", "parallel_tool_calls": False,
    "text": {"format": {"type": "json_object"}}, "reasoning": {"effort": "low"},
    "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.5, "top_logprobs": 2,
    "include": ["message.output_text.logprobs"], "stream": True,
    "chat_template_kwargs": {"enable_thinking": False},
    # no-ops
    "metadata": {"k": "v"}, "user": "u", "safety_identifier": "s", "prompt_cache_key": "k",
    "prompt_cache_retention": "24h", "max_tool_calls": 3,
    "image": {"context_compression": "disabled"},
    "stream_options": {"include_obfuscation": False},
    # refused
    "service_tier": "flex", "store": True, "previous_response_id": "resp_1",
    "conversation": "conv_1", "background": True, "background_options": {
        "completion_window": "2h"}, "prompt": {"id": "pmpt_1"}, "truncation": "auto",
    "context_management": [{"type": "compaction"}],
    "prompt_cache_options": {"mode": "explicit"},
    "moderation": {"model": "omni-moderation-latest"},
    "access_programs": {"cyber": "daybreak_red"},
}
NEEDS: dict[str, dict[str, Any]] = {"top_logprobs": {"include": SAMPLES["include"]}}


def cases(handling: Handling) -> list[str]:
    return [name for name, rule in REQUEST.items() if rule.handling is handling]


def wiring(body: dict[str, Any]) -> Any:
    """Everything the gateway takes from a body: the SDK keywords and the answer's form."""
    request = parse_request(msgspec.json.encode(body))
    return (msgspec.to_builtins(request.options), request.stream, request.logprobs,
            request.model)


def test_every_openai_body_field_is_classified() -> None:
    assert OPENAI_FIELDS - set(REQUEST) == set(), "fields of the openai package nobody classified"
    assert set(REQUEST) - OPENAI_FIELDS == EXTRAS, "classified fields openai does not have"


@pytest.mark.parametrize(("rules", "openai_fields"), NESTED)
def test_every_openai_nested_field_is_classified(rules: Mapping[str, Rule],
                                                 openai_fields: set[str]) -> None:
    assert set(rules) == openai_fields


@pytest.mark.parametrize("name", cases(Handling.HONOURED))
def test_an_honoured_field_changes_what_the_gateway_asks(name: str) -> None:
    base = {**BASE, **NEEDS.get(name, {})}
    assert wiring({**base, name: SAMPLES[name]}) != wiring(base)


@pytest.mark.parametrize("name", cases(Handling.NO_OP))
def test_a_no_op_field_changes_nothing(name: str) -> None:
    assert wiring({**BASE, name: SAMPLES[name]}) == wiring(BASE)


NESTED_REFUSED = [
    ({**BASE, "tools": [{**WEATHER, name: "x"}]}, f"tools[0].{name}")
    for name, rule in fields.FUNCTION_TOOL.items() if rule.handling is Handling.REFUSED
] + [
    ({**BASE, "input": [{"type": kind, name: "x"}]}, f"input[0].{name}")
    for kind, rules in fields.ITEMS.items()
    for name, rule in rules.items() if rule.handling is Handling.REFUSED
] + [
    ({**BASE, "text": {name: "x"}}, f"text.{name}")
    for name, rule in fields.TEXT.items() if rule.handling is Handling.REFUSED
] + [
    ({**BASE, "reasoning": {name: "x"}}, f"reasoning.{name}")
    for name, rule in fields.REASONING.items() if rule.handling is Handling.REFUSED
]


@pytest.mark.parametrize(("body", "param"), NESTED_REFUSED, ids=[p for _, p in NESTED_REFUSED])
def test_a_refused_nested_field_is_a_400_naming_it(body: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as refused:
        parse_request(msgspec.json.encode(body))
    assert refused.value.status == 400
    assert refused.value.param == param
    assert "is not supported" in refused.value.message


def test_the_docs_table_is_the_classification() -> None:
    assert markdown_table() in doc_text("http-api.md")


# ------------------------------------------------------------------ a real gateway


@pytest.fixture(scope="module")
def api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    gateway = GatewayProcess(fresh_db_url(redis_url, DB),
                             Path(tmp_path_factory.mktemp("responses-fields-gateway"))).start()
    try:
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                           timeout=30) as client:
            yield client
    finally:
        gateway.stop()


def send(api: openai.OpenAI, body: dict[str, Any]) -> Any:
    """``responses.create`` with ``body``: the package's own keywords where it has them."""
    own = {k: v for k, v in body.items() if k in OPENAI_FIELDS}
    extra = {k: v for k, v in body.items() if k not in OPENAI_FIELDS}
    return api.responses.create(**{**BASE, **own}, extra_body=extra or None)


@pytest.mark.parametrize("name", cases(Handling.REFUSED))
def test_a_refused_field_is_a_400_naming_it(api: openai.OpenAI, name: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        send(api, {name: SAMPLES[name]})
    assert refused.value.param == name
    assert name in refused.value.message
    for inert in REQUEST[name].inert:
        if inert is not None:  # asks for nothing: past the checks, to "no worker" (503)
            with pytest.raises(openai.InternalServerError):
                send(api, {name: inert})


@pytest.mark.parametrize("name", cases(Handling.NO_OP))
def test_a_no_op_field_is_accepted(api: openai.OpenAI, name: str) -> None:
    with pytest.raises(openai.InternalServerError):  # past the checks, to "no worker" (503)
        send(api, {name: SAMPLES[name]})


def test_an_unknown_field_is_a_400_naming_it(api: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        send(api, {"extra_body_field": 1})
    assert refused.value.param == "extra_body_field"
    assert "unknown field" in refused.value.message
    with pytest.raises(openai.BadRequestError) as nested:
        send(api, {"tools": [{**WEATHER, "colour": "red"}]})
    assert nested.value.param == "tools[0].colour"
