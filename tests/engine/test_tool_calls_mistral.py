"""Mistral tool calls after the ``[TOOL_CALLS]`` special token, read back token by token.

Parallel calls are what Mistral-Instruct v0.3's own template writes for a tool-call turn
(``[TOOL_CALLS] [{...}, {...}]</s>``, with the 9-character ids that template demands,
which the parser skips); the newer ``[TOOL_CALLS]name[ARGS]{...}`` form is written by
hand. ``[TOOL_CALLS]`` and ``[ARGS]`` are special tokens: the parser sees them although
the text skips special tokens, and ``</s>`` never reaches the answer.
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
from kvrelay_worker.engine.tools.detect import detect_tool_format
from kvrelay_worker.engine.tools.plan import ToolPlan

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}},
]
PLAN = ToolPlan(mode="auto", format="mistral", tools=tuple(
    ToolSpec(function=FunctionSpec(name=t["function"]["name"])) for t in TOOLS))
MESSAGES = [{"role": "user", "content": "Weather in Lyon, and the time there?"}]
WEATHER = {"city": "Lyon", "units": ["C"]}
TIME = {"tz": "Europe/Paris"}


@pytest.fixture(scope="module")
def tokenizer(tokenizer_folder: Path) -> Any:
    return family_tokenizer(tokenizer_folder, "mistral")


def stream(tokenizer: Any, output: str, steps: list[int] | None = None) -> Any:
    ids = tokenizer.encode(output, add_special_tokens=False)
    return stream_tokens(tokenizer, SamplingParams(tool_plan=PLAN), ids, steps=steps)


def test_the_template_is_detected_as_mistral() -> None:
    assert detect_tool_format(chat_template("mistral")) == "mistral"


@pytest.mark.parametrize("calls", [
    [("get_weather", WEATHER)],
    [("get_weather", WEATHER), ("get_time", TIME)],
])
def test_template_written_calls_stream_back(tokenizer: Any,
                                            calls: list[tuple[str, dict[str, Any]]]) -> None:
    reply = {"role": "assistant", "tool_calls": [
        {"id": f"abcdefgh{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)]}
    written = assistant_turn(tokenizer, MESSAGES, TOOLS, reply)
    assert written.startswith("[TOOL_CALLS] [")
    assert written.endswith("]</s>")
    streamed = stream(tokenizer, written)
    assert streamed.named_arguments() == [(n, json.dumps(a)) for n, a in calls]
    assert streamed.text == ""
    assert streamed.finish_reason == "tool_calls"
    count = len(tokenizer.encode(written, add_special_tokens=False))
    for seed in range(3):
        assert stream(tokenizer, written, random_steps(count, seed)).calls == streamed.calls


@pytest.mark.parametrize(("output", "text", "calls"), [
    ('Sure. [TOOL_CALLS] [{"name": "get_time", "arguments": {"tz": "UTC"}}]</s>', "Sure.",
     [("get_time", '{"tz": "UTC"}')]),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}</s>',
     "", [("get_weather", '{"city": "Lyon"}'), ("get_time", '{"tz": "UTC"}')]),
    ("[TOOL_CALLS] I cannot call tools.</s>", "[TOOL_CALLS] I cannot call tools.", []),
    ('[TOOL_CALLS] [{"name": "format_disk", "arguments": {}}]</s>',
     '[TOOL_CALLS] [{"name": "format_disk", "arguments": {}}]', []),
    ("Lyon is sunny.</s>", "Lyon is sunny.", []),
])
def test_calls_and_text_token_by_token(tokenizer: Any, output: str, text: str,
                                       calls: list[tuple[str, str]]) -> None:
    streamed = stream(tokenizer, output)
    assert streamed.named_arguments() == calls
    assert streamed.text == text
    assert streamed.finish_reason == ("tool_calls" if calls else "stop")


def test_the_markers_are_special_tokens_the_parser_still_sees(tokenizer: Any) -> None:
    for marker in ("[TOOL_CALLS]", "[ARGS]"):
        token = tokenizer.convert_tokens_to_ids(marker)
        assert token in tokenizer.all_special_ids
        assert tokenizer.decode([token], skip_special_tokens=True) == ""
    streamed = stream(tokenizer, '[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}</s>')
    assert streamed.named_arguments() == [("get_time", '{"tz": "UTC"}')]
