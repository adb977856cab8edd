"""``OutputAssembler`` turns a job's chunks into Responses output items and the events that
build them; the ``openai`` package's own stream accumulator (``ResponseStreamState``, what
``client.responses.stream`` runs) must rebuild the same items from the events.

Chunks with reasoning and interleaved tool-call pieces need a model that reasons and a
parser: here they are built as the SDK delivers them, so every shape is covered without
one (the end-to-end tests run the shapes SmolLM2 produces).
"""

from __future__ import annotations

from typing import Any

from helpers.response_items import call_item, message_item, reasoning_item, text_part
from openai import omit
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from kvrelay.completion import StreamChunk
from kvrelay.gateway.responses_api.output_items import OutputAssembler
from kvrelay.gateway.responses_api.response_object import response_body, usage_body
from kvrelay.protocol import TokenLogprob, ToolCallDelta, TopLogprob, Usage

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
JOB = "job-1"
ECHO: dict[str, Any] = {"parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


def chunk(text: str = "", *, reasoning: str = "", calls: list[ToolCallDelta] | None = None,
          tokens: int = 1, logprobs: list[TokenLogprob] | None = None) -> StreamChunk:
    return StreamChunk(seq=0, index=0, text=text, token_ids=list(range(tokens)),
                       reasoning=reasoning, tool_calls=calls, logprobs=logprobs)


def replay(chunks: list[StreamChunk], *, status: str = "completed",
           logprobs: bool = False) -> tuple[OutputAssembler, list[Any], Response]:
    """Feed ``chunks``; run every event through openai's accumulator (strictly typed first);
    return the assembler, the typed events and the SDK's final response."""
    assembler = OutputAssembler(JOB, logprobs=logprobs)
    created = response_body(job_id=JOB, model="m", created_at=1, echo=ECHO,
                            status="in_progress")
    raw: list[dict[str, Any]] = [{"type": "response.created", "response": created}]
    for c in chunks:
        raw.extend(assembler.add(c))
    raw.extend(assembler.close("incomplete" if status == "incomplete" else "completed"))
    final = response_body(job_id=JOB, model="m", created_at=1, echo=ECHO, status=status,
                          output=assembler.output,
                          usage=usage_body(Usage(prompt_tokens=5, completion_tokens=9),
                                           assembler.reasoning_tokens))
    raw.append({"type": f"response.{status}", "response": final})
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[], text_format=omit)
    events: list[Any] = []
    for number, event in enumerate(raw):
        typed = EVENTS.validate_python({"sequence_number": number, **event})
        events.extend(state.handle_event(typed))
    done = events[-1].response
    ours = [item.model_dump(exclude_none=True) for item in Response.model_validate(final).output]
    assert [item.model_dump(exclude_none=True) for item in done.output] == ours
    for item in done.output:  # what the SDK accumulated from the deltas is the final item
        if item.type == "message":
            texts = [e.snapshot for e in events
                     if e.type == "response.output_text.delta" and e.item_id == item.id]
            assert texts[-1] == text_part(item).text
        elif item.type == "function_call":
            arguments = [e.snapshot for e in events
                         if e.type == "response.function_call_arguments.delta"
                         and e.item_id == item.id]
            assert (arguments[-1] if arguments else "") == call_item(item).arguments
    return assembler, events, done


def test_reasoning_then_text_then_two_interleaved_calls() -> None:
    assembler, events, done = replay([
        chunk(reasoning="The user wants", tokens=2),
        chunk(reasoning=" the weather."),
        chunk("Let me check."),
        chunk(calls=[ToolCallDelta(index=0, id="call_a", name="get_weather",
                                   arguments='{"city": ')]),
        chunk(calls=[ToolCallDelta(index=1, id="call_b", name="get_time", arguments="{")]),
        chunk(calls=[ToolCallDelta(index=0, arguments='"Paris"}'),
                     ToolCallDelta(index=1, arguments='"city": "Paris"}')]),
    ])
    assert [item.type for item in done.output] == ["reasoning", "message", "function_call",
                                                   "function_call"]
    reasoning = reasoning_item(done.output[0])
    weather, time = call_item(done.output[2]), call_item(done.output[3])
    assert reasoning.content is not None
    assert reasoning.content[0].text == "The user wants the weather."
    assert text_part(done.output[1]).text == "Let me check."
    assert (weather.call_id, weather.name, weather.arguments) == (
        "call_a", "get_weather", '{"city": "Paris"}')
    assert (time.call_id, time.arguments) == ("call_b", '{"city": "Paris"}')
    assert reasoning.status == message_item(done.output[1]).status == "completed"
    assert weather.status == time.status == "completed"
    assert len({item.id for item in done.output}) == 4
    assert assembler.reasoning_tokens == 3
    assert done.usage is not None
    assert done.usage.output_tokens_details.reasoning_tokens == 3
    reasoning_deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(reasoning_deltas) == "The user wants the weather."


def test_whitespace_between_calls_opens_no_message_but_a_blank_answer_is_one() -> None:
    _, _, done = replay([
        chunk(calls=[ToolCallDelta(index=0, id="call_a", name="f", arguments="{}")]),
        chunk("\n"),
        chunk(calls=[ToolCallDelta(index=1, id="call_b", name="f", arguments="{}")]),
        chunk("\n"),
    ])
    assert [item.type for item in done.output] == ["function_call", "function_call"]
    _, _, blank = replay([chunk("\n"), chunk(" ")])
    assert [item.type for item in blank.output] == ["message"]
    assert blank.output_text == "\n "
    _, _, empty = replay([])
    assert [item.type for item in empty.output] == ["message"]
    assert empty.output_text == ""


def test_text_after_whitespace_keeps_the_whitespace() -> None:
    _, events, done = replay([chunk("\n\n"), chunk("Paris"), chunk(".")])
    assert done.output_text == "\n\nParis."
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["\n\nParis", "."]


def test_a_cut_off_answer_marks_its_open_items_incomplete() -> None:
    _, _, done = replay([chunk(reasoning="Hmm"), chunk("The answer is")], status="incomplete")
    assert reasoning_item(done.output[0]).status == "completed"
    assert message_item(done.output[1]).status == "incomplete"
    _, _, calls = replay([
        chunk(calls=[ToolCallDelta(index=0, id="call_a", name="f", arguments="{}")]),
        chunk(calls=[ToolCallDelta(index=1, id="call_b", name="f", arguments='{"x": ')]),
    ], status="incomplete")
    assert [call_item(c).status for c in calls.output] == ["completed", "incomplete"]


def test_the_output_while_items_are_open_marks_them_incomplete() -> None:
    """What a ``response.failed`` event carries: what was built, the rest unfinished."""
    assembler = OutputAssembler(JOB)
    assembler.add(chunk("Partial"))
    assembler.add(chunk(calls=[ToolCallDelta(index=0, id="c", name="f", arguments='{"a"')]))
    [message, call] = assembler.output
    assert (message["status"], message["content"][0]["text"]) == ("completed", "Partial")
    assert (call["status"], call["arguments"]) == ("incomplete", '{"a"')
    assert assembler.output == [message, call]  # reading it changed nothing


def test_logprobs_ride_on_the_deltas_and_the_part() -> None:
    paris = TokenLogprob(token_id=7, logprob=-0.1, token_bytes=b"Paris",
                         top=[TopLogprob(7, -0.1, b"Paris"), TopLogprob(9, -2.5, b"Rome")])
    unnamed = TokenLogprob(token_id=3, logprob=-0.5)
    _, events, done = replay([chunk("Paris", logprobs=[paris]),
                              chunk("!", logprobs=[unnamed])], logprobs=True)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert [lp.token for d in deltas for lp in d.logprobs] == ["Paris", "token_id:3"]
    assert deltas[0].logprobs[0].top_logprobs[1].token == "Rome"
    part = text_part(done.output[0])
    assert part.logprobs is not None
    assert [lp.bytes for lp in part.logprobs] == [list(b"Paris"), []]
    assert part.logprobs[0].top_logprobs[1].logprob == -2.5
    _, _, without = replay([chunk("Paris", logprobs=[paris])])
    assert text_part(without.output[0]).logprobs == []
