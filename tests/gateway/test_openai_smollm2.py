"""The official ``openai`` package against the gateway and a real worker serving SmolLM2.

Sync and async clients, streaming and not, chat and completions, ``n=2``, logprobs;
tool calls (forced by name and by ``required``, refused by ``none``, and a follow-up turn
with the tool's result) and ``echo`` with the prompt's log-probabilities.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from helpers.gateway_process import GatewayProcess
from helpers.worker_process import WorkerProcess
from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
PARIS: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def gateway(smollm2_worker: tuple[str, WorkerProcess],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    url, _ = smollm2_worker
    process = GatewayProcess(url, tmp_path_factory.mktemp("gateway")).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def client(gateway: GatewayProcess) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                timeout=120) as openai:
        yield openai


def test_models_lists_the_served_model(client: OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_answers_paris_and_the_stream_adds_up_to_it(client: OpenAI) -> None:
    done = client.chat.completions.create(model=MODEL, messages=PARIS, max_tokens=32,
                                          temperature=0)
    answer = done.choices[0].message.content
    assert answer is not None
    assert "Paris" in answer
    assert done.choices[0].message.role == "assistant"
    assert done.choices[0].finish_reason in ("stop", "length")
    assert done.id.startswith("chatcmpl-")
    assert done.object == "chat.completion"
    assert done.usage is not None
    assert done.usage.prompt_tokens > 0
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    assert done.system_fingerprint  # the worker that ran it

    stream = client.chat.completions.create(model=MODEL, messages=PARIS, max_tokens=32,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    deltas: list[str] = []
    reasons: list[str] = []
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            deltas.append(choice.delta.content or "")
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
        usage = chunk.usage or usage
    assert "".join(deltas) == answer
    assert reasons == [done.choices[0].finish_reason]
    assert usage is not None
    assert usage.completion_tokens == done.usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens_details.cached_tokens or 0) > 0  # the same prompt, cached


def test_completions_stream_and_whole_agree(client: OpenAI) -> None:
    done = client.completions.create(model=MODEL, prompt="The capital of France is",
                                     max_tokens=12, temperature=0)
    text = done.choices[0].text
    assert text
    assert done.object == "text_completion"
    assert done.usage is not None
    assert done.usage.completion_tokens <= 12
    pieces = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0,
        stream=True) if c.choices]
    assert "".join(pieces) == text


def test_n_two_and_logprobs(client: OpenAI) -> None:
    done = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a color."}], n=2,
        max_tokens=8, temperature=1.0, seed=3, logprobs=True, top_logprobs=2,
        extra_body={"ignore_eos": True})
    assert [c.index for c in done.choices] == [0, 1]
    assert done.choices[0].message.content != done.choices[1].message.content
    for choice in done.choices:
        assert choice.logprobs is not None
        assert choice.logprobs.content is not None
        assert len(choice.logprobs.content) == 8
        for item in choice.logprobs.content:
            assert item.logprob <= 0.0
            assert len(item.top_logprobs) == 2
            assert item.bytes is not None  # the token's bytes, and its text from them
            assert item.token == bytes(item.bytes).decode("utf-8", "replace")
    assert done.usage is not None
    assert done.usage.completion_tokens == 16

    text = client.completions.create(model=MODEL, prompt="Colors:", n=2, max_tokens=5,
                                     temperature=0, logprobs=3,
                                     extra_body={"ignore_eos": True})
    assert len(text.choices) == 2
    lp = text.choices[1].logprobs
    assert lp is not None
    assert lp.token_logprobs is not None
    assert lp.top_logprobs is not None
    assert len(lp.token_logprobs) == 5
    assert all(len(t) == 3 for t in lp.top_logprobs)
    # greedy: both choices are the same text
    assert text.choices[0].text == text.choices[1].text


async def test_async_client_stream_and_whole(gateway: GatewayProcess) -> None:
    async with AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused",
                           max_retries=0, timeout=120) as client:
        done = await client.chat.completions.create(model=MODEL, messages=PARIS,
                                                    max_tokens=32, temperature=0)
        answer = done.choices[0].message.content
        assert answer is not None
        assert "Paris" in answer
        stream = await client.chat.completions.create(model=MODEL, messages=PARIS,
                                                      max_tokens=32, temperature=0,
                                                      stream=True)
        deltas = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert "".join(deltas) == answer
        text = await client.completions.create(model=MODEL, prompt="One, two, three,",
                                               max_tokens=6, temperature=0)
        streamed = await client.completions.create(model=MODEL, prompt="One, two, three,",
                                                   max_tokens=6, temperature=0, stream=True)
        pieces = [c.choices[0].text async for c in streamed if c.choices]
        assert "".join(pieces) == text.choices[0].text


CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"], "additionalProperties": False}
ZONE = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}
SCHEMAS = {"get_weather": CITY, "get_time": ZONE}
TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY,
                                      "description": "The current weather in a city."}},
    {"type": "function", "function": {"name": "get_time", "parameters": ZONE,
                                      "description": "The time now in a time zone."}},
]
WEATHER: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the weather in Paris?"}]
FORCED = [({"type": "function", "function": {"name": "get_weather"}}, True),
          ("required", False)]


def streamed_calls(client: OpenAI, **request: Any) -> tuple[list[tuple[str, str]], str | None]:
    """The calls a stream sends, assembled from its pieces, and its finish reason; each
    call's id, type and name come once, on its first piece."""
    calls: dict[int, tuple[str, list[str]]] = {}
    reason = None
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            reason = choice.finish_reason or reason
            for piece in choice.delta.tool_calls or ():
                assert piece.function is not None
                if piece.index not in calls:
                    assert piece.id
                    assert piece.type == "function"
                    assert piece.function.name
                    calls[piece.index] = (piece.function.name, [])
                else:
                    assert piece.id is None
                    assert piece.function.name is None
                calls[piece.index][1].append(piece.function.arguments or "")
    return [(name, "".join(parts)) for _, (name, parts) in sorted(calls.items())], reason


@pytest.mark.parametrize(("tool_choice", "parallel"), FORCED, ids=["named", "required"])
def test_forced_tool_calls_validate_and_stream_the_same(client: OpenAI, tool_choice: Any,
                                                        parallel: bool) -> None:
    request: dict[str, Any] = {"model": MODEL, "messages": WEATHER, "tools": TOOLS,
                               "tool_choice": tool_choice, "parallel_tool_calls": parallel,
                               "temperature": 0, "max_tokens": 120}
    done = client.chat.completions.create(**request)
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls
    assert choice.message.content is None
    if isinstance(tool_choice, dict):
        assert [c.function.name for c in calls] == ["get_weather"]
    for call in calls:
        assert call.type == "function"
        assert call.id
        name, arguments = call.function.name, call.function.arguments
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    pieces, reason = streamed_calls(client, **request)
    assert reason == "tool_calls"
    assert pieces == [(c.function.name, c.function.arguments)
                      for c in calls]


def test_tool_choice_none_answers_in_text_and_a_tool_result_is_answered(client: OpenAI) -> None:
    plain = client.chat.completions.create(model=MODEL, messages=WEATHER, tools=TOOLS,
                                           tool_choice="none", temperature=0, max_tokens=24)
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].message.content
    assert plain.choices[0].finish_reason in ("stop", "length")

    called = client.chat.completions.create(
        model=MODEL, messages=WEATHER, tools=TOOLS, temperature=0, max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    message = called.choices[0].message
    assert message.tool_calls
    follow_up: list[Any] = [*WEATHER, message,  # the response's message, sent back as is
                            {"role": "tool", "tool_call_id": message.tool_calls[0].id,
                             "content": "Sunny, 21 degrees."}]
    answer = client.chat.completions.create(model=MODEL, messages=follow_up, tools=TOOLS,
                                            tool_choice="none", temperature=0, max_tokens=24)
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_echo_scores_the_prompt_then_continues_it(client: OpenAI) -> None:
    prompt = "The capital of France is Paris."
    scored = client.completions.create(model=MODEL, prompt=prompt, echo=True, max_tokens=0,
                                       logprobs=1)
    assert scored.usage is not None
    count = scored.usage.prompt_tokens
    choice = scored.choices[0]
    assert choice.text == prompt
    lp = choice.logprobs
    assert lp is not None
    assert lp.tokens
    assert lp.token_logprobs
    assert lp.top_logprobs
    assert lp.text_offset
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == count
    assert "".join(lp.tokens) == prompt
    assert lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None
    assert all(v is not None and v <= 0.0 for v in lp.token_logprobs[1:])
    assert all(len(t) == 1 for t in lp.top_logprobs[1:])
    assert lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset)

    more = client.completions.create(model=MODEL, prompt=prompt, echo=True, max_tokens=4,
                                     logprobs=1, temperature=0, extra_body={"ignore_eos": True})
    text = more.choices[0].text
    assert text.startswith(prompt)
    assert len(text) > len(prompt)
    both = more.choices[0].logprobs
    assert both is not None
    assert both.token_logprobs
    assert both.text_offset
    assert len(both.token_logprobs) == count + 4
    assert both.token_logprobs[:count] == pytest.approx(lp.token_logprobs, abs=1e-3)
    assert both.text_offset[count] == len(prompt)
    pieces = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, echo=True, max_tokens=4, logprobs=1, temperature=0,
        extra_body={"ignore_eos": True}, stream=True) if c.choices]
    assert "".join(pieces) == text
