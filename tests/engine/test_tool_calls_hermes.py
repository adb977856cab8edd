"""Hermes tool calls as Qwen2.5-Instruct writes them, read back token by token.

The calls are what Qwen2.5's own chat template writes for an assistant turn with tool
calls (so the parser reads the format the model was trained on), tokenized by a
tokenizer with Qwen's ``<tool_call>`` tokens, and streamed through the worker's real
detokenizer and parsers one token per step, and in random steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.family_tokenizers import assistant_turn, chat_template, family_tokenizer
from helpers.parse_stream import random_steps, stream_tokens

from kvrelay.protocol import FunctionSpec, ToolSpec
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.tools.detect import detect_reasoning_format, detect_tool_format
from kvrelay_worker.engine.tools.parsed_output import tool_call_id
from kvrelay_worker.engine.tools.plan import ToolPlan

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}},
]
PLAN = ToolPlan(mode="auto", format="hermes", tools=tuple(
    ToolSpec(function=FunctionSpec(name=t["function"]["name"])) for t in TOOLS))
MESSAGES = [{"role": "user", "content": "Weather in Zürich, and the time?"}]
WEATHER = {"city": "Zürich \"Altstadt\""}
TIME = {"tz": "Europe/Zurich"}


@pytest.fixture(scope="module")
def tokenizer(tokenizer_folder: Path) -> Any:
    return family_tokenizer(tokenizer_folder, "qwen2.5")


def reply(content: str | None, *calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": f"call{i:05d}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)]}


def test_the_template_is_detected_as_hermes() -> None:
    assert detect_tool_format(chat_template("qwen2.5")) == "hermes"
    assert detect_reasoning_format(chat_template("qwen2.5")) is None


@pytest.mark.parametrize(("content", "calls"), [
    (None, [("get_weather", WEATHER)]),
    (None, [("get_weather", WEATHER), ("get_time", TIME)]),
    ("Let me look that up.", [("get_time", TIME)]),
])
def test_template_written_calls_stream_back(tokenizer: Any, content: str | None,
                                            calls: list[tuple[str, dict[str, Any]]]) -> None:
    written = assistant_turn(tokenizer, MESSAGES, TOOLS, reply(content, *calls))
    assert "<tool_call>" in written
    assert written.endswith("<|im_end|>")
    ids = tokenizer.encode(written, add_special_tokens=False)
    params = SamplingParams(tool_plan=PLAN)
    streamed = stream_tokens(tokenizer, params, ids)
    assert streamed.named_arguments() == [
        (name, json.dumps(args, ensure_ascii=False)) for name, args in calls]
    assert [c["id"] for _, c in sorted(streamed.calls.items())] == [
        tool_call_id("req-1", 0, i) for i in range(len(calls))]
    assert streamed.text == (content or "")  # no tag, no EOS, no layout newline
    assert streamed.finish_reason == "tool_calls"
    # Arguments arrive in pieces while the model writes them, not at the end.
    assert len([d for d in streamed.deltas if d.arguments]) > len(calls)
    for seed in range(5):
        again = stream_tokens(tokenizer, params, ids, steps=random_steps(len(ids), seed))
        assert (again.text, again.calls) == (streamed.text, streamed.calls)


@pytest.mark.parametrize("output", [
    "<tool_call>\nnot a call\n</tool_call><|im_end|>",
    '<tool_call>\n{"name": "delete_all", "arguments": {}}\n</tool_call><|im_end|>',
    '<tool_call>\n{"name": "get_weather", "argu',
])
def test_malformed_calls_come_back_as_text(tokenizer: Any, output: str) -> None:
    ids = tokenizer.encode(output, add_special_tokens=False)
    streamed = stream_tokens(tokenizer, SamplingParams(tool_plan=PLAN), ids)
    assert streamed.calls == {}
    assert streamed.text == output.removesuffix("<|im_end|>")
    assert streamed.finish_reason == "stop"


def test_plain_answers_are_untouched(tokenizer: Any) -> None:
    output = "It is 21 °C in Zürich <b>now</b>.\n\nAnything else?<|im_end|>"
    ids = tokenizer.encode(output, add_special_tokens=False)
    streamed = stream_tokens(tokenizer, SamplingParams(tool_plan=PLAN), ids)
    assert streamed.text == output.removesuffix("<|im_end|>")
    assert streamed.calls == {}
    assert streamed.finish_reason == "stop"
