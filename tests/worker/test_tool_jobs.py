"""Jobs with tools through the real queue and a real worker (tiny model, SmolLM2's template).

Options that cannot all hold, and conversations the template cannot take, each end in
one ``Failed`` with ``invalid_request`` naming the problem, and the worker goes on; a
``required`` job's tokens are the documented array of valid calls, whatever the model.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers.celery_send import send_raw
from helpers.job_log import wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay.protocol import Failed, Finished, Tokens

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
PARAMETERS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 6},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]


def job(job_id: str, **fields: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"job_id": job_id, "model": MODEL, "messages": ASK,
                               "tools": [TOOL], "sampling": {"max_tokens": 48, "seed": 1}}
    payload.update(fields)
    return payload


REFUSED: list[tuple[dict[str, Any], list[str]]] = [
    ({"tool_choice": "required",
      "sampling": {"max_tokens": 8, "response_format": {"type": "json_object"}}},
     ["response_format 'json_object'", "tool_choice 'required'"]),
    ({"messages": None, "prompt": "hi", "chat_template_kwargs": {"enable_thinking": False}},
     ["chat_template_kwargs", "need messages"]),
    ({"chat_template_kwargs": {"enable_thinking": False}},
     ["does not read ['enable_thinking']"]),
    ({"chat_template_kwargs": {"tools": []}}, ["may not set ['tools']"]),
    ({"messages": [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "function": {"name": "get_weather", "arguments": "{city: Oslo}"}}]}]},
     ["message 1 tool call 0 ('get_weather') arguments are not valid JSON"]),
]


def test_impossible_tool_jobs_fail_alone_and_forced_calls_validate(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        tokenizer_folder: Path) -> None:
    worker = start_worker("tools", concurrency=4)
    refused = {uuid.uuid4().hex: (fields, names) for fields, names in REFUSED}
    required = uuid.uuid4().hex
    follow_up = uuid.uuid4().hex
    send_raw(clean_redis_url, MODEL, [
        *[(job_id, [job(job_id, **fields)], {}) for job_id, (fields, _) in refused.items()],
        (required, [job(required, tool_choice="required", parallel_tool_calls=False,
                        sampling={"max_tokens": 64, "temperature": 1.0, "seed": 3})], {}),
        (follow_up, [job(follow_up, messages=[*ASK, {
            "role": "assistant", "content": None, "tool_calls": [{
                "id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Oslo","days":2}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "rain"}])], {}),
    ])
    for job_id, (_, names) in refused.items():
        events = wait_terminal(clean_redis_url, job_id, timeout=60)
        assert len(events) == 1, events
        failed = events[0]
        assert isinstance(failed, Failed)
        assert failed.code == "invalid_request"
        for name in names:
            assert name in failed.message, (name, failed.message)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    events = wait_terminal(clean_redis_url, required, timeout=120)
    assert isinstance(events[-1], Finished), events[-1]
    tokens = [t for e in events if isinstance(e, Tokens) for t in e.token_ids]
    calls = json.loads(str(tokenizer.decode(tokens, skip_special_tokens=True)))
    assert len(calls) == 1
    assert calls[0]["name"] == "get_weather"
    jsonschema.validate(calls[0]["arguments"], PARAMETERS)
    assert isinstance(wait_terminal(clean_redis_url, follow_up, timeout=120)[-1], Finished)
    assert worker.alive()
