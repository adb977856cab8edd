"""Llama 3 JSON tool calls, read back token by token through the real detokenizer.

The single call is what Llama 3.2-Instruct's own template writes for a tool-call turn
(``{"name": ..., "parameters": ...}`` then ``<|eot_id|>``); parallel calls (``;``) and
the ``<|python_tag|>`` form are written by hand, as the template shows only one call.
``<|python_tag|>`` is a special token: the parser must see it although the text skips
special tokens, while ``<|eot_id|>`` and ``<|eom_id|>`` never reach the answer.
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
PLAN = ToolPlan(mode="auto", format="llama3_json", tools=tuple(
    ToolSpec(function=FunctionSpec(name=t["function"]["name"])) for t in TOOLS))
MESSAGES = [{"role": "user", "content": "Weather in Oslo?"}]
WEATHER = json.dumps({"city": "Oslo", "days": [1, 2]})
TIME = json.dumps({"tz": "CET"})


@pytest.fixture(scope="module")
def tokenizer(tokenizer_folder: Path) -> Any:
    return family_tokenizer(tokenizer_folder, "llama3")


def stream(tokenizer: Any, output: str, steps: list[int] | None = None) -> Any:
    ids = tokenizer.encode(output, add_special_tokens=False)
    return stream_tokens(tokenizer, SamplingParams(tool_plan=PLAN), ids, steps=steps)


def test_the_template_is_detected_as_llama3_json() -> None:
    assert detect_tool_format(chat_template("llama3")) == "llama3_json"


def test_the_template_written_call_streams_back(tokenizer: Any) -> None:
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": [1, 2]}}}
    written = assistant_turn(tokenizer, MESSAGES, TOOLS,
                             {"role": "assistant", "tool_calls": [call]})
    assert written == f'{{"name": "get_weather", "parameters": {WEATHER}}}<|eot_id|>'
    streamed = stream(tokenizer, written)
    assert streamed.named_arguments() == [("get_weather", WEATHER)]
    assert streamed.text == ""
    assert streamed.finish_reason == "tool_calls"


@pytest.mark.parametrize(("output", "text", "calls"), [
    (f'{{"name": "get_weather", "parameters": {WEATHER}}}; {{"name": "get_time", '
     f'"parameters": {TIME}}}<|eot_id|>', "", [("get_weather", WEATHER), ("get_time", TIME)]),
    (f'<|python_tag|>{{"name": "get_time", "arguments": {TIME}}}<|eom_id|>', "",
     [("get_time", TIME)]),
    (f'Checking. <|python_tag|>{{"name": "get_time", "parameters": {TIME}}}<|eom_id|>',
     "Checking.", [("get_time", TIME)]),
    ('{"name": "Oslo", "population": 709000}<|eot_id|>',
     '{"name": "Oslo", "population": 709000}', []),
    ("<|python_tag|>brave_search.call(query=\"oslo\")<|eom_id|>",
     "<|python_tag|>brave_search.call(query=\"oslo\")", []),
    ("It is sunny in Oslo.<|eot_id|>", "It is sunny in Oslo.", []),
])
def test_calls_and_text_token_by_token(tokenizer: Any, output: str, text: str,
                                       calls: list[tuple[str, str]]) -> None:
    streamed = stream(tokenizer, output)
    assert streamed.named_arguments() == calls
    assert streamed.text == text
    assert streamed.finish_reason == ("tool_calls" if calls else "stop")
    count = len(tokenizer.encode(output, add_special_tokens=False))
    in_steps = stream(tokenizer, output, steps=random_steps(count, seed=count))
    assert (in_steps.text, in_steps.calls) == (streamed.text, streamed.calls)


def test_the_python_tag_is_a_special_token_the_parser_still_sees(tokenizer: Any) -> None:
    tag = tokenizer.convert_tokens_to_ids("<|python_tag|>")
    assert tag in tokenizer.all_special_ids
    assert tokenizer.decode([tag], skip_special_tokens=True) == ""
    streamed = stream(tokenizer, f'<|python_tag|>{{"name": "get_time", "arguments": {TIME}}}')
    assert streamed.named_arguments() == [("get_time", TIME)]
