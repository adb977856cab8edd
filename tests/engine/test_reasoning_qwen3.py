"""Reasoning apart from the answer, with Qwen3's chat template and think tokens.

Qwen3's template writes an assistant turn as ``<think>\\n{reasoning}\\n</think>\\n\\n
{answer}``: streamed back through the real detokenizer and the ``think`` parser, one
token per step or in random steps, it splits into the same reasoning and answer. With
``enable_thinking`` false the template closes an empty block in the prompt, so the whole
output is answer; a DeepSeek-R1-style prompt that ends inside ``<think>`` makes the
output start as reasoning.
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
from kvrelay_worker.engine.tools.detect import (
    detect_reasoning_format,
    detect_tool_format,
    prompt_opens_reasoning,
)
from kvrelay_worker.engine.tools.plan import ToolPlan

MESSAGES = [{"role": "user", "content": "What is 17 * 3?"}]
REASONING = "17 * 3: 10 * 3 = 30,\n7 * 3 = 21.\n\nSo 51."
ANSWER = "17 × 3 = **51**."
THINK = SamplingParams(reasoning_parser="think")


@pytest.fixture(scope="module")
def tokenizer(tokenizer_folder: Path) -> Any:
    return family_tokenizer(tokenizer_folder, "qwen3")


def prompt_ids(tokenizer: Any, **kwargs: Any) -> list[int]:
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                         tokenize=False, **kwargs)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


def test_the_template_is_detected_as_thinking_and_hermes() -> None:
    assert detect_reasoning_format(chat_template("qwen3")) == "think"
    assert detect_tool_format(chat_template("qwen3")) == "hermes"


def test_template_written_reasoning_splits_from_the_answer(tokenizer: Any) -> None:
    written = assistant_turn(tokenizer, MESSAGES, None, {
        "role": "assistant", "reasoning_content": REASONING, "content": ANSWER})
    assert written.startswith("<think>\n")
    ids = tokenizer.encode(written, add_special_tokens=False)
    prompt = prompt_ids(tokenizer)
    streamed = stream_tokens(tokenizer, THINK, ids, prompt_ids=prompt)
    assert (streamed.reasoning, streamed.text) == (REASONING, ANSWER)
    assert streamed.finish_reason == "stop"
    for seed in range(4):
        again = stream_tokens(tokenizer, THINK, ids, random_steps(len(ids), seed),
                              prompt_ids=prompt)
        assert (again.reasoning, again.text) == (REASONING, ANSWER)


def test_a_call_after_thinking_is_a_call(tokenizer: Any) -> None:
    tools = [{"type": "function", "function": {"name": "multiply", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    written = assistant_turn(tokenizer, MESSAGES, tools, {
        "role": "assistant", "reasoning_content": "I should use the tool.", "content": "",
        "tool_calls": [{"id": "c0", "type": "function",
                        "function": {"name": "multiply", "arguments": {"a": 17, "b": 3}}}]})
    plan = ToolPlan(mode="auto", format="hermes",
                    tools=(ToolSpec(function=FunctionSpec(name="multiply")),))
    params = SamplingParams(tool_plan=plan, reasoning_parser="think")
    ids = tokenizer.encode(written, add_special_tokens=False)
    streamed = stream_tokens(tokenizer, params, ids)
    assert streamed.reasoning == "I should use the tool."
    assert streamed.named_arguments() == [("multiply", json.dumps({"a": 17, "b": 3}))]
    assert streamed.text == ""
    assert streamed.finish_reason == "tool_calls"


def test_with_thinking_off_the_output_is_all_answer(tokenizer: Any) -> None:
    prompt = prompt_ids(tokenizer, enable_thinking=False)
    assert tokenizer.decode(prompt).endswith("<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning(tokenizer.decode(prompt))
    ids = tokenizer.encode(ANSWER + "<|im_end|>", add_special_tokens=False)
    streamed = stream_tokens(tokenizer, THINK, ids, prompt_ids=prompt)
    assert (streamed.reasoning, streamed.text) == ("", ANSWER)


def test_a_prompt_ending_inside_think_starts_in_reasoning(tokenizer: Any) -> None:
    prompt = prompt_ids(tokenizer) + tokenizer.encode("<think>\n", add_special_tokens=False)
    ids = tokenizer.encode(f"{REASONING}\n</think>\n\n{ANSWER}<|im_end|>",
                           add_special_tokens=False)
    streamed = stream_tokens(tokenizer, THINK, ids, prompt_ids=prompt)
    assert (streamed.reasoning, streamed.text) == (REASONING, ANSWER)
    # The same output after a prompt that does not open the block is answer throughout.
    plain = stream_tokens(tokenizer, THINK, ids, prompt_ids=prompt_ids(tokenizer))
    assert plain.reasoning == ""
    assert plain.text.startswith(REASONING)
