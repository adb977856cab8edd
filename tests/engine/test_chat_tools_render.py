"""Tool calls, tool results, reasoning and template variables rendered as transformers does.

The wire carries a call's arguments as JSON text and OpenAI's shapes; a transformers user
passes the arguments as a mapping (its tool-use guide) and an empty content for a
calling turn (Qwen3's template reads ``message.content`` on every assistant turn). The
worker's rendering of the wire form must give exactly the prompt transformers gives for
that, text and token ids, on Qwen3's published template (``tests/fixtures``), with
SmolLM2's tokenizer and ``<think>``/``</think>`` added as Qwen's tokenizer has them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvrelay.protocol import ChatMessage, ToolSpec
from kvrelay_worker.engine.chat import apply_chat_template, render_chat
from kvrelay_worker.engine.errors import InvalidPromptError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "chat_templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "local_time", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def smollm2_tokenizer(tokenizer_folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_folder))


@pytest.fixture(scope="module")
def qwen3_tokenizer(tokenizer_folder: Path) -> Any:
    """SmolLM2's vocabulary with Qwen3's template and its think tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    tokenizer.add_tokens(["<think>", "</think>"], special_tokens=False)
    tokenizer.chat_template = (FIXTURES / "qwen3.jinja").read_text(encoding="utf-8")
    return tokenizer


def wire(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as a worker decodes them from a request: through ``ChatMessage``."""
    decoded = msgspec.convert(messages, list[ChatMessage])
    return [msgspec.to_builtins(m) for m in decoded]


def as_transformers_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same conversation as transformers' guide writes it: arguments as mappings."""
    out = []
    for message in messages:
        message = {**message, "content": message.get("content") or ""}
        if "tool_calls" in message:
            message["tool_calls"] = [
                {**call, "function": {**call["function"],
                                      "arguments": json.loads(call["function"]["arguments"])}}
                for call in message["tool_calls"]]
        out.append(message)
    return out


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A call as OpenAI clients send it: compact JSON text (a template printing the text
    as it is would show it compact; transformers' ``tojson`` of the mapping does not)."""
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, separators=(",", ":"))}}


CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Weather and time in Paris and Oslo?"},
    {"role": "assistant", "content": None, "reasoning_content": "Two cities, two tools.",
     "tool_calls": [call("c1", "get_weather", {"city": "Paris", "unit": "c"}),
                    call("c2", "local_time", {"city": "Oslo"})]},
    {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "21 C, sunny"},
    {"role": "tool", "tool_call_id": "c2", "name": "local_time", "content": "14:05"},
]


def test_tools_calls_results_and_reasoning_render_as_transformers(qwen3_tokenizer: Any) -> None:
    tools = msgspec.convert([WEATHER, TIME], list[ToolSpec])
    ours = render_chat(qwen3_tokenizer, wire(CONVERSATION), tools=tools)
    theirs = qwen3_tokenizer.apply_chat_template(
        as_transformers_user(CONVERSATION), tools=[WEATHER, TIME], add_generation_prompt=True,
        tokenize=False)
    assert ours == theirs
    # What makes the test able to fail: the parts that need the reshaping are there.
    assert '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}' in ours
    assert "<tool_response>\n14:05\n</tool_response>" in ours
    assert "Two cities, two tools." in ours
    assert '"description": "The weather in a city now."' in ours
    ids = apply_chat_template(qwen3_tokenizer, wire(CONVERSATION), tools=tools)
    assert ids == qwen3_tokenizer.apply_chat_template(
        as_transformers_user(CONVERSATION), tools=[WEATHER, TIME], add_generation_prompt=True,
        tokenize=True, return_dict=False)


# One call per turn (Llama 3.2 allows no more) with a Mistral-style nine-character id.
ONE_CALL: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None,
     "tool_calls": [call("abcDEF123", "get_weather", {"city": "Paris", "unit": "c"})]},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": "21 C"},
    {"role": "assistant", "content": "It is 21 C."},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.mark.parametrize(("template", "variables"), [
    ("llama3_2_instruct", {"date_string": "01 Jan 2025"}),  # tojson of the arguments
    ("mistral_instruct_v0_3", {}),  # [TOOL_CALLS] with the call ids
    ("qwen2_5_instruct", {}),
])
def test_vendor_templates_render_calls_as_transformers(tokenizer_folder: Path, template: str,
                                                       variables: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    tokenizer.chat_template = (FIXTURES / f"{template}.jinja").read_text(encoding="utf-8")
    ours = render_chat(tokenizer, wire(ONE_CALL), template_kwargs=variables or None,
                       tools=msgspec.convert([WEATHER, TIME], list[ToolSpec]))
    assert ours == tokenizer.apply_chat_template(
        as_transformers_user(ONE_CALL), tools=[WEATHER, TIME], add_generation_prompt=True,
        tokenize=False, **variables)
    assert '"city": "Paris", "unit": "c"}' in ours


def test_enable_thinking_false_changes_the_prompt_as_transformers(qwen3_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    thinking = render_chat(qwen3_tokenizer, wire(messages))
    quiet = render_chat(qwen3_tokenizer, wire(messages),
                        template_kwargs={"enable_thinking": False})
    assert quiet == qwen3_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert thinking == qwen3_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)
    assert quiet == thinking + "<think>\n\n</think>\n\n"
    quiet_ids = apply_chat_template(qwen3_tokenizer, wire(messages),
                                    template_kwargs={"enable_thinking": False})
    assert quiet_ids == qwen3_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False,
        enable_thinking=False)
    for think_id in qwen3_tokenizer.convert_tokens_to_ids(["<think>", "</think>"]):
        assert think_id in quiet_ids  # one token each, as in Qwen's vocabulary


def test_a_template_without_tools_shows_calls_as_json(smollm2_tokenizer: Any) -> None:
    """SmolLM2's ChatML template knows no tool calls: the calls become the turn's text,
    and a follow-up after the tool results renders."""
    ours = render_chat(smollm2_tokenizer, wire(CONVERSATION),
                       tools=msgspec.convert([WEATHER], list[ToolSpec]))
    calls = ('[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, '
             '{"name": "local_time", "arguments": {"city": "Oslo"}}]')
    expected = [{"role": m["role"], "content": m["content"] or ""} for m in CONVERSATION]
    expected[2]["content"] = calls
    assert ours == smollm2_tokenizer.apply_chat_template(
        expected, add_generation_prompt=True, tokenize=False)
    assert ours.endswith("<|im_start|>tool\n14:05<|im_end|>\n<|im_start|>assistant\n")
    spoken = [*CONVERSATION, {"role": "assistant", "content": "Sunny, 14:05."},
              {"role": "user", "content": "Thanks"}]
    assert render_chat(smollm2_tokenizer, wire(spoken)).endswith(
        "<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n")


def test_a_text_turn_beside_its_calls_keeps_both(smollm2_tokenizer: Any) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "Let me look.",
         "tool_calls": [call("c1", "get_weather", {"city": "Paris"})]}]
    rendered = render_chat(smollm2_tokenizer, wire(messages), add_generation_prompt=False)
    assert ('Let me look.\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|im_end|>'
            in rendered)


def test_reasoning_effort_reaches_a_template_that_reads_it(tokenizer_folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    tokenizer.chat_template = ("{{ reasoning_effort }}|{{ depth }}|"
                               "{% for m in messages %}{{ m.content }}{% endfor %}")
    text = render_chat(tokenizer, [{"role": "user", "content": "x"}], reasoning_effort="low",
                       template_kwargs={"depth": 3})
    assert text == "low|3|x"


@pytest.mark.parametrize(("messages", "kwargs", "message"), [
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "{oops"}}]}], {},
     r"message 0 tool call 0 \('f'\) arguments are not valid JSON"),
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "[1, 2]"}}]}], {},
     "must be a JSON object, got list"),
    ([{"role": "user", "content": None}], {}, r"message 0 \(user\) must have content"),
    ([{"role": "user", "content": "x", "tool_calls": []}], {}, "only an assistant calls"),
    ([{"role": "user", "content": "x", "reasoning_content": "r"}], {}, "only an assistant"),
    ([{"role": "user", "content": "x", "images": []}], {}, r"unknown keys \['images'\]"),
    ([{"role": "user", "content": "x"}], {"template_kwargs": {"tokenize": True}},
     r"may not set \['tokenize'\]"),
    ([{"role": "user", "content": "x"}], {"template_kwargs": {"messages": []}},
     r"may not set \['messages'\]"),
    ([{"role": "user", "content": "x"}], {"template_kwargs": {"enable_thinking": False}},
     r"does not read \['enable_thinking'\]"),
    ([{"role": "user", "content": "x"}], {"reasoning_effort": "high"},
     r"does not read \['reasoning_effort'\]"),
])
def test_what_cannot_render_is_refused_by_name(smollm2_tokenizer: Any,
                                               messages: list[dict[str, Any]],
                                               kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidPromptError, match=message):
        render_chat(smollm2_tokenizer, messages, **kwargs)

