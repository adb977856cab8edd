"""Structured output through the OpenAI gateway, spoken to with the real ``openai`` client.

A random-weight model writes valid JSON only when the grammar forces it, so a parsed,
valid answer shows ``response_format`` (and vLLM's ``guided_choice``) reached the engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import jsonschema
import openai
import pytest
from helpers.gateway_process import GatewayProcess
from helpers.worker_process import WorkerProcess
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


@pytest.fixture
def api(start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        tmp_path: Path) -> Iterator[OpenAI]:
    start_worker(concurrency=4)
    gateway = GatewayProcess(clean_redis_url, tmp_path, "gateway").start()
    try:
        with OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                    timeout=60) as client:
            yield client
    finally:
        gateway.stop()


def test_json_schema_choice_and_bad_format(api: OpenAI) -> None:
    done = api.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=1.0, seed=4, max_tokens=200,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "city", "schema": SCHEMA}})
    choice = done.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content is not None
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)

    picked = api.completions.create(model=MODEL, prompt="Pick:", max_tokens=20, seed=1,
                                    extra_body={"guided_choice": ["left", "right"]})
    assert picked.choices[0].text in ("left", "right")

    with pytest.raises(openai.BadRequestError, match="response_format"):
        api.chat.completions.create(model=MODEL, messages=MESSAGES,
                                    extra_body={"response_format": {"type": "regex"}})
