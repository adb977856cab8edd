"""The chat keywords (tools, tool_choice, parallel_tool_calls, chat_template_kwargs,
reasoning_effort) and tool-carrying messages: OpenAI's dict forms and the wire structs
reach the request as the worker will decode it; every bad value is ``InvalidRequest``
naming it, raised before anything is enqueued."""

from __future__ import annotations

from typing import Any

import pytest

import kvrelay
from kvrelay.protocol import (
    MAX_TEMPLATE_KWARGS_BYTES,
    MAX_TOOLS,
    FunctionName,
    FunctionSpec,
    NamedToolChoice,
    ToolSpec,
    decode_request_json,
    encode_request,
)
from kvrelay.request_builder import build_request

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALLED: list[dict[str, Any]] = [
    *ASK,
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]


def build(prompt: str | None = None, **options: Any) -> Any:
    request, _ = build_request(prompt, options, default_model="m", now=1.0)
    assert decode_request_json(encode_request(request)) == request  # as a worker reads it
    return request


def test_openai_dicts_and_wire_structs_are_the_same_request() -> None:
    common: dict[str, Any] = {"messages": ASK, "parallel_tool_calls": False,
                              "reasoning_effort": "low", "job_id": "j",
                              "chat_template_kwargs": {"enable_thinking": False}}
    as_dicts = build(tools=[WEATHER],
                     tool_choice={"type": "function", "function": {"name": "get_weather"}},
                     **common)
    spec = ToolSpec(function=FunctionSpec(**WEATHER["function"]))  # type: ignore[arg-type]
    as_structs = build(tools=[spec],
                       tool_choice=NamedToolChoice(function=FunctionName(name="get_weather")),
                       **common)
    assert encode_request(as_dicts) == encode_request(as_structs)
    assert as_dicts.tools == [spec]
    assert as_dicts.tool_choice.function.name == "get_weather"
    assert as_dicts.parallel_tool_calls is False
    assert as_dicts.reasoning_effort == "low"
    assert as_dicts.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
def test_tool_choice_words(choice: str) -> None:
    assert build(messages=ASK, tools=[WEATHER], tool_choice=choice).tool_choice == choice


def test_left_out_the_chat_fields_stay_off_the_wire() -> None:
    request = build(messages=ASK)
    assert (request.tools, request.tool_choice, request.chat_template_kwargs,
            request.reasoning_effort) == (None, None, None, None)
    assert request.parallel_tool_calls is True
    assert b"tools" not in encode_request(request)
    assert build(messages=ASK, tools=[]).tools is None  # no tools is no tools


def test_a_conversation_with_a_tool_call_and_its_result() -> None:
    request = build(messages=[{"role": "system", "content": "Be brief.", "name": "rules"},
                              *CALLED,
                              {"role": "assistant", "content": "Sunny.",
                               "reasoning_content": "The tool said sunny."}],
                    tools=[WEATHER])
    system, _, assistant, tool, answer = request.messages
    assert system.name == "rules"
    assert assistant.content is None
    assert assistant.tool_calls[0].id == "call_1"
    assert assistant.tool_calls[0].function.arguments == '{"city": "Paris"}'
    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "call_1", "sunny, 21 C")
    assert answer.reasoning_content == "The tool said sunny."


def test_text_parts_are_joined() -> None:
    request = build(messages=[{"role": "user", "content": [
        {"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]}])
    assert request.messages[0].content == "Hello, world"


def test_prompt_logprobs_with_max_tokens_zero_scores_the_prompt() -> None:
    sampling = build("The sky is", prompt_logprobs=2, max_tokens=0).sampling
    assert (sampling.prompt_logprobs, sampling.max_tokens) == (2, 0)


CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"tools": WEATHER}, "tools must be a list"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]},
         r"tools\[0\]\.type: only 'function'"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]},
         r"tools\[0\]\.function\.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": True,
                                                      "extra": 1}}]},
         r"tools\[0\]\.function has unsupported keys \['extra'\]"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
         r"tools\[0\]\.function\.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "description": "x" * 40_000}}}]}, r"tools\[0\]\.function: the parameters schema"),
        ({"tools": [WEATHER, WEATHER]}, "two tools share a name"),
        ({"tools": [WEATHER] * (MAX_TOOLS + 1)}, f"at most {MAX_TOOLS} tools"),
        ({"tool_choice": "always"}, "tool_choice: expected one of auto, none, required"),
        ({"tool_choice": "required"}, "tool_choice 'required' needs tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice names 'x', which is not one of tools"),
        ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {}}},
         r"tool_choice\.type: only 'function'"),
        ({"tool_choice": {"type": "function", "function": {"name": "f", "x": 1}}},
         r"tool_choice\.function has unsupported keys"),
        ({"parallel_tool_calls": 1}, "parallel_tool_calls must be a bool"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort: expected one of none"),
        ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs must be a dict"),
        ({"chat_template_kwargs": {1: True}}, "chat_template_kwargs must be a dict with str"),
        ({"chat_template_kwargs": {"x": object()}}, "chat_template_kwargs must hold JSON"),
        ({"chat_template_kwargs": {"x": "y" * MAX_TEMPLATE_KWARGS_BYTES}},
         "chat_template_kwargs is .* bytes of JSON"),
    ],
)
def test_bad_chat_keywords_name_themselves(options: dict[str, Any], match: str) -> None:
    with pytest.raises(kvrelay.InvalidRequest, match=match):
        build(messages=ASK, **options)


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([{"role": "user", "content": None}], r"messages\[0\]\['content'\] must be a str"),
        ([{"role": "user", "content": "x", "tool_calls": [CALL]}],
         r"messages\[0\]\.tool_calls: only an assistant message"),
        ([{"role": "user", "content": "x", "reasoning_content": "r"}],
         r"messages\[0\]\.reasoning_content: only an assistant"),
        ([{"role": "user", "content": "x", "tool_call_id": "c"}],
         r"messages\[0\]\.tool_call_id: only a"),
        ([{"role": "tool", "content": "x"}], r"messages\[0\]\.tool_call_id: a tool message"),
        ([{"role": "assistant", "content": None, "tool_calls": [CALL]},
          {"role": "tool", "tool_call_id": "other", "content": "x"}],
         r"messages\[1\]\.tool_call_id: 'other' answers no tool call"),
        ([{"role": "tool", "tool_call_id": "c", "content": "x"},
          {"role": "assistant", "content": None, "tool_calls": [CALL]}],
         r"messages\[0\]\.tool_call_id: 'c' answers no tool call"),
        ([{"role": "assistant", "content": None, "tool_calls": [
            {**CALL, "function": {"name": "f", "arguments": {"city": "Paris"}}}]}],
         r"messages\[0\]\.tool_calls\[0\]\.function\.arguments must be a str"),
        ([{"role": "assistant", "content": None, "tool_calls": [{**CALL, "type": "custom"}]}],
         r"messages\[0\]\.tool_calls\[0\]\.type: only 'function'"),
        ([{"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": ""}]}],
         r"messages\[0\]\.tool_calls\[0\]\.id"),
        ([{"role": "assistant", "content": None, "tool_calls": CALL}],
         r"messages\[0\]\.tool_calls must be a list"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
         r"messages\[0\]\.content\[0\]\.type: only text parts"),
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}],
         r"messages\[0\]\.content\[0\]\.text must be a str"),
        ([{"role": "user", "content": "x", "name": 7}], r"messages\[0\]\.name"),
    ],
)
def test_bad_messages_name_the_message_and_field(messages: list[Any], match: str) -> None:
    with pytest.raises(kvrelay.InvalidRequest, match=match):
        build(messages=messages)


@pytest.mark.parametrize("keyword", ["tools", "tool_choice", "chat_template_kwargs",
                                     "reasoning_effort"])
def test_template_keywords_need_messages(keyword: str) -> None:
    values: dict[str, Any] = {"tools": [WEATHER], "tool_choice": "auto",
                              "chat_template_kwargs": {"a": 1}, "reasoning_effort": "low"}
    value = values[keyword]
    with pytest.raises(kvrelay.InvalidRequest, match=f"{keyword} need messages="):
        build("a plain prompt", **{keyword: value})
    with pytest.raises(kvrelay.InvalidRequest, match=f"{keyword} need messages="):
        build(prompt_token_ids=[1, 2], **{keyword: value})


def test_max_tokens_zero_needs_prompt_logprobs() -> None:
    with pytest.raises(kvrelay.InvalidRequest, match="max_tokens may be 0 only with "
                                                     "prompt_logprobs"):
        build("x", max_tokens=0)
    with pytest.raises(kvrelay.InvalidRequest, match="prompt_logprobs"):
        build("x", prompt_logprobs=21)


async def test_nothing_is_enqueued_for_a_bad_keyword(client: kvrelay.AsyncClient,
                                                     worker: Any) -> None:
    with pytest.raises(kvrelay.InvalidRequest, match="tool_choice"):
        await client.generate(messages=ASK, tool_choice="required")
    assert worker.requests == []
    done = await client.generate(messages=CALLED, tools=[WEATHER], tool_choice="auto")
    assert done.text == "Hello"
    sent = worker.requests[0]
    assert sent.tools[0].function.name == "get_weather"
    assert sent.messages[2].tool_call_id == "call_1"
