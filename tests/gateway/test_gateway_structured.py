"""Structured output through the OpenAI gateway, spoken to with the real ``openai`` client.

A random-weight model writes valid JSON only when the grammar forces it, so a parsed,
valid answer shows ``response_format`` (and vLLM's ``guided_choice``) reached the engine.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12},
                   "rank": {"type": "integer", "minimum": 1, "maximum": 9},
                   "sunny": {"type": "boolean"}},
    "required": ["city", "rank", "sunny"],
    "additionalProperties": False,
}
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "A city as JSON."}]


def test_json_schema_choice_and_bad_format(tiny_api: OpenAI) -> None:
    done = tiny_api.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=1.0, seed=4, max_tokens=200,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "city", "schema": SCHEMA}})
    choice = done.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content is not None
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)

    picked = tiny_api.completions.create(model=MODEL, prompt="Pick:", max_tokens=20, seed=1,
                                    extra_body={"guided_choice": ["left", "right"]})
    assert picked.choices[0].text in ("left", "right")

    with pytest.raises(openai.BadRequestError, match="response_format"):
        tiny_api.chat.completions.create(model=MODEL, messages=MESSAGES,
                                    extra_body={"response_format": {"type": "regex"}})
