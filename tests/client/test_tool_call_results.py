"""What the SDK hands back when a worker's events carry reasoning, tool-call pieces and
the prompt's log-probabilities: each ``StreamChunk`` as sent, and a ``Completion`` whose
tool calls are the pieces assembled (also when the stream keeps no output)."""

from __future__ import annotations

from typing import Any

from helpers.fake_worker import play

import kvrelay
from kvrelay.protocol import (
    Finished,
    FunctionCall,
    GenerateRequest,
    PromptLogprob,
    Started,
    Tokens,
    ToolCall,
    ToolCallDelta,
    Usage,
)

ASK = [{"role": "user", "content": "Weather in Paris and Rome?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]
SCORED: list[PromptLogprob | None] = [
    None, PromptLogprob(token_id=7, logprob=-1.5, token_bytes=b" sky")]


def calling_events() -> list[Any]:
    """Reasoning, then two calls whose arguments arrive in pieces, then "tool_calls"."""
    return [
        Started(seq=0, worker="w", prompt_tokens=4),
        Tokens(seq=1, token_ids=[1], text="", reasoning="Two cities: ",
               prompt_logprobs=SCORED),
        Tokens(seq=2, token_ids=[2], text="", reasoning="two calls."),
        Tokens(seq=3, token_ids=[3], text="", tool_calls=[
            ToolCallDelta(index=0, id="call_a", name="get_weather", arguments='{"city": ')]),
        Tokens(seq=4, token_ids=[4], text="", tool_calls=[
            ToolCallDelta(index=0, arguments='"Paris"}'),
            ToolCallDelta(index=1, id="call_b", name="get_weather", arguments="{")]),
        Tokens(seq=5, token_ids=[5], text="", tool_calls=[
            ToolCallDelta(index=1, arguments='"city": "Rome"}')], finish_reason="tool_calls"),
        Finished(seq=6, finish_reason="tool_calls", finish_reasons=["tool_calls"],
                 usage=Usage(prompt_tokens=4, completion_tokens=5)),
    ]


async def calling(worker: Any, request: GenerateRequest) -> None:
    await play(worker.redis, request.job_id, calling_events())


CALLS = [
    ToolCall(id="call_a", function=FunctionCall(name="get_weather",
                                                arguments='{"city": "Paris"}')),
    ToolCall(id="call_b", function=FunctionCall(name="get_weather",
                                                arguments='{"city": "Rome"}')),
]


async def test_a_completion_holds_the_assembled_calls_and_the_reasoning(
        client: kvrelay.AsyncClient, worker: Any) -> None:
    worker.behaviour = calling
    done = await client.generate(messages=ASK, tools=TOOLS, tool_choice="required")
    assert done.finish_reason == "tool_calls"
    assert done.tool_calls == CALLS
    assert done.choices[0].tool_calls == CALLS
    assert done.reasoning == "Two cities: two calls."
    assert done.text == ""
    assert done.prompt_logprobs == SCORED


async def test_stream_chunks_carry_each_piece_as_sent(client: kvrelay.AsyncClient,
                                                     worker: Any) -> None:
    worker.behaviour = calling
    async with client.stream(messages=ASK, tools=TOOLS) as stream:
        chunks = [chunk async for chunk in stream]
        done = await stream.final()
    assert [c.reasoning for c in chunks] == ["Two cities: ", "two calls.", "", "", ""]
    assert chunks[0].prompt_logprobs == SCORED
    assert all(c.prompt_logprobs is None for c in chunks[1:])
    pieces = [d for c in chunks for d in c.tool_calls or ()]
    assert [(d.index, d.id, d.name) for d in pieces] == [
        (0, "call_a", "get_weather"), (0, None, None), (1, "call_b", "get_weather"),
        (1, None, None)]
    assert done.tool_calls == CALLS


async def test_a_stream_that_keeps_no_output_still_has_the_calls(
        client: kvrelay.AsyncClient, worker: Any) -> None:
    worker.behaviour = calling
    stream = client.stream(messages=ASK, tools=TOOLS)
    stream.discard_output()
    async with stream:
        async for _ in stream:
            pass
        done = await stream.final()
    assert done.tool_calls == CALLS
    assert done.reasoning == ""  # output is not kept: the caller had every chunk
