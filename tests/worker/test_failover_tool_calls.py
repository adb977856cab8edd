"""A tool call and a model's reasoning survive their worker's death mid-stream.

Two jobs stream from worker ``a`` on a tiny random Qwen3 model whose tokenizer carries
Qwen3's chat template (so the worker reads its reasoning syntax from the template): a
named tool choice, whose long arguments only the tool grammar makes valid, and a
thinking answer spelled out by a regex. ``a`` is SIGKILLed while the call's arguments
and the reasoning are streaming; worker ``b`` takes both jobs over, replays the parsers
over the tokens already in the logs and goes on. Each job's events must carry one
unbroken stream: contiguous ``seq``, the call's id and name once (the id the first
attempt gave), arguments and reasoning without a piece twice or missing; the assembled
call byte-identical to an undisturbed greedy run's, the reasoning and answer apart.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
from helpers.celery_send import send_requests
from helpers.family_tokenizers import chat_template
from helpers.job_log import read_events, wait_terminal
from helpers.worker_fixtures import TINY_KV_BYTES
from helpers.worker_process import WorkerProcess

from kvrelay.completion import Completion, CompletionBuilder
from kvrelay.protocol import (
    AnyEvent,
    Finished,
    FunctionName,
    GenerateRequest,
    NamedToolChoice,
    RegexFormat,
    SamplingOptions,
    Started,
    Tokens,
    ToolSpec,
)
from kvrelay_worker.engine.tools.parsed_output import tool_call_id

pytestmark = pytest.mark.integration

MODEL = "qwen3-think"
SCHEMA = {"type": "object", "properties": {
    "station": {"enum": ["north", "south"]},
    "readings": {"type": "array", "items": {"type": "integer", "minimum": 100,
                                            "maximum": 999},
                 "minItems": 80, "maxItems": 80}},
    "required": ["station", "readings"], "additionalProperties": False}
TOOLS = msgspec.convert([{"type": "function", "function": {
    "name": "record", "description": "Store readings.", "parameters": SCHEMA}}], list[ToolSpec])
REASONING = " ".join(f"Step {i}: the sum so far is {i * (i + 1) // 2}." for i in range(1, 40))
ANSWER = "The total is 780."
THOUGHT = f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"


@pytest.fixture
def thinking_model(tiny_model: Callable[[str], Path], tmp_path: Path) -> Path:
    """The tiny Qwen3 with Qwen3's chat template in its tokenizer config."""
    folder = tmp_path / MODEL
    shutil.copytree(tiny_model("qwen3-qk-norm"), folder)
    (folder / "chat_template.jinja").write_text(chat_template("qwen3"))
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = chat_template("qwen3")
    config_path.write_text(json.dumps(config))
    return folder


def tool_request() -> GenerateRequest:
    return GenerateRequest(
        job_id=uuid.uuid4().hex, model=MODEL, prompt="Readings:", tools=TOOLS,
        tool_choice=NamedToolChoice(function=FunctionName(name="record")),
        sampling=SamplingOptions(max_tokens=2000, temperature=0.0), enqueued_at=time.time())


def thinking_request() -> GenerateRequest:
    pattern = THOUGHT.replace(".", r"\.")
    return GenerateRequest(
        job_id=uuid.uuid4().hex, model=MODEL, prompt="Add 1 to 39:",
        sampling=SamplingOptions(max_tokens=2000, temperature=0.0,
                                 response_format=RegexFormat(pattern=pattern)),
        enqueued_at=time.time())


def completion_of(job_id: str, events: list[AnyEvent]) -> Completion:
    """What the SDK assembles from the events (its non-streaming answer)."""
    builder = CompletionBuilder(job_id, model=MODEL)
    for event in events:
        if isinstance(event, Started):
            builder.add_started(event)
        elif isinstance(event, Tokens):
            builder.add_tokens(event)
    assert isinstance(events[-1], Finished), events[-1]
    return builder.build(events[-1])


def streaming(url: str, job_id: str, part: str) -> bool:
    """Whether the job has sent a few pieces of ``part`` and is not done yet."""
    events = read_events(url, job_id)
    if any(isinstance(e, Finished) for e in events):
        raise AssertionError(f"job {job_id} finished before the kill: make it longer")
    tokens = [e for e in events if isinstance(e, Tokens)]
    if part == "arguments":
        return sum(1 for e in tokens for c in e.tool_calls or () if c.arguments) >= 3
    return sum(1 for e in tokens if e.reasoning) >= 3


def wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise TimeoutError(what)


def check_one_stream(events: list[AnyEvent]) -> tuple[list[Tokens], list[Tokens]]:
    """Contiguous seq, two attempts; the Tokens events before and after the takeover."""
    assert [e.seq for e in events] == list(range(len(events)))
    starts = [i for i, e in enumerate(events) if isinstance(e, Started)]
    assert [events[i].attempt for i in starts] == [1, 2]  # type: ignore[union-attr]
    before = [e for e in events[:starts[1]] if isinstance(e, Tokens)]
    after = [e for e in events[starts[1]:] if isinstance(e, Tokens)]
    return before, after


def test_a_call_and_reasoning_continue_exactly_after_a_kill(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        thinking_model: Path) -> None:
    url = clean_redis_url
    settings: dict[str, Any] = {"model": str(thinking_model), "concurrency": 4,
                                "kv_cache_memory": TINY_KV_BYTES, "swap_space_gib": 0.25}
    a = start_worker("a", **settings)
    call_job, thought_job = tool_request(), thinking_request()
    send_requests(url, [call_job, thought_job])
    wait(lambda: streaming(url, call_job.job_id, "arguments")
         and streaming(url, thought_job.job_id, "reasoning"), 90,
         "the jobs did not start streaming on worker a")
    a.kill()
    b = start_worker("b", **settings)

    # The call: one id, sent once, the first attempt's; arguments continued exactly.
    events = wait_terminal(url, call_job.job_id, timeout=120)
    before, after = check_one_stream(events)
    pieces = [c for e in before + after for c in e.tool_calls or ()]
    assert [(c.id, c.name) for c in pieces if c.id is not None] == [
        (tool_call_id(call_job.job_id, 0, 0), "record")]
    assert any(c.arguments for e in before for c in e.tool_calls or ())
    assert any(c.arguments for e in after for c in e.tool_calls or ())
    assert all(e.text == "" for e in before + after)
    done = completion_of(call_job.job_id, events)
    assert done.finish_reason == "tool_calls"
    (call,) = done.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)

    reference_job = tool_request()
    send_requests(url, [reference_job])
    reference = completion_of(reference_job.job_id,
                              wait_terminal(url, reference_job.job_id, timeout=120))
    assert [(c.function.name, c.function.arguments) for c in reference.tool_calls] == [
        (call.function.name, call.function.arguments)]

    # The reasoning: apart from the answer on both sides of the takeover.
    events = wait_terminal(url, thought_job.job_id, timeout=120)
    before, after = check_one_stream(events)
    assert any(e.reasoning for e in before)
    assert any(e.reasoning for e in after)
    done = completion_of(thought_job.job_id, events)
    assert (done.reasoning, done.text) == (REASONING, ANSWER)
    assert done.finish_reason == "stop"
    assert b.info() is not None
