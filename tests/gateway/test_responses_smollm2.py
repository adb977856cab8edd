"""``POST /v1/responses`` through the official ``openai`` package, a real gateway and a real
worker serving SmolLM2: text and item inputs, structured output, streaming parsed by the
SDK's own event types, and OpenAI's ``Response`` model validating every answer strictly
(the SDK's parser alone accepts objects with fields missing).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from helpers.gateway_process import GatewayProcess
from helpers.response_items import call_item, message_item, text_part
from helpers.worker_process import WorkerProcess
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
PARIS = "What is the capital of France?"
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                                "country": {"type": "string"}},
               "required": ["city", "country"], "additionalProperties": False}


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


def post(gateway: GatewayProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/responses", json=body, timeout=120)


def sse_events(gateway: GatewayProcess, body: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(event name, data)`` of each event of a streamed answer, read off the wire."""
    out: list[tuple[str, Any]] = []
    with httpx.stream("POST", f"{gateway.url}/v1/responses", json={**body, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
    return out


def test_text_input_answers_in_a_response_the_openai_model_validates(
        gateway: GatewayProcess, client: OpenAI) -> None:
    raw = post(gateway, {"model": MODEL, "input": PARIS, "max_output_tokens": 32,
                         "temperature": 0})
    assert raw.status_code == 200, raw.text
    response = Response.model_validate(raw.json())  # strict: every required field present
    assert response.object == "response"
    assert response.status == "completed"
    assert response.id.startswith("resp_")
    assert "Paris" in response.output_text
    [item] = response.output
    assert message_item(item).status == "completed"
    usage = response.usage
    assert usage is not None
    assert usage.input_tokens > 0
    assert 0 < usage.output_tokens <= 32
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert raw.json()["store"] is False

    same = client.responses.create(model=MODEL, input=PARIS, max_output_tokens=32,
                                   temperature=0, metadata={"run": "test"})
    assert same.output_text == response.output_text
    assert same.metadata == {"run": "test"}
    assert same.usage is not None
    assert same.usage.input_tokens_details.cached_tokens > 0  # the same prompt, cached


def test_instructions_and_message_items_reach_the_prompt(client: OpenAI) -> None:
    def input_tokens(instructions: str, *items: Any) -> int:
        response = client.responses.create(
            model=MODEL, instructions=instructions, max_output_tokens=1, temperature=0,
            input=[*items, {"role": "user", "content": [{"type": "input_text", "text": PARIS}]}])
        assert response.instructions == instructions
        assert response.usage is not None
        return response.usage.input_tokens

    short = input_tokens("Answer briefly.")
    assert input_tokens("Answer briefly, in one word, and say nothing else at all.") > short + 5
    assert input_tokens("Answer briefly.",
                        {"role": "developer", "content": "Never use more than one word."},
                        {"role": "assistant", "content": "Understood."}) > short + 10


def test_max_output_tokens_ends_an_incomplete_response(gateway: GatewayProcess) -> None:
    raw = post(gateway, {"model": MODEL, "input": "Tell me a long story.",
                         "max_output_tokens": 3, "temperature": 0})
    response = Response.model_validate(raw.json())
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None
    assert response.usage.output_tokens == 3
    assert message_item(response.output[0]).status == "incomplete"


def test_function_call_items_and_their_output_are_rendered(client: OpenAI) -> None:
    """A follow-up turn: the call and its result are part of the prompt (more input
    tokens than without the result), and the model answers in text."""
    tool: Any = {"type": "function", "name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}, "strict": True}
    asked: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"},
                        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                         "arguments": '{"city": "Paris"}', "id": "fc_1",
                         "status": "completed"}]
    answered = [*asked, {"type": "function_call_output", "call_id": "call_1",
                         "output": "Sunny and 24 degrees Celsius."}]
    without = client.responses.create(model=MODEL, input=asked, tools=[tool],
                                      tool_choice="none", max_output_tokens=2, temperature=0)
    response = client.responses.create(model=MODEL, input=answered, tools=[tool],
                                       tool_choice="none", max_output_tokens=24,
                                       temperature=0)
    assert without.usage is not None
    assert response.usage is not None
    assert response.usage.input_tokens > without.usage.input_tokens + 5
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text.strip()


def test_text_format_json_schema_constrains_the_output(client: OpenAI) -> None:
    response = client.responses.create(
        model=MODEL, input="Name a city and its country, as JSON.", temperature=0,
        max_output_tokens=48,
        text={"format": {"type": "json_schema", "name": "city", "schema": CITY_SCHEMA,
                         "strict": True}})
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), CITY_SCHEMA)
    assert response.text is not None
    assert response.text.format is not None
    assert response.text.format.type == "json_schema"


def test_stream_events_are_typed_numbered_and_add_up_to_the_whole_answer(
        gateway: GatewayProcess, client: OpenAI) -> None:
    body: dict[str, Any] = {"model": MODEL, "input": PARIS, "max_output_tokens": 24,
                            "temperature": 0}
    whole = Response.model_validate(post(gateway, body).json())
    events = sse_events(gateway, body)
    for name, data in events:
        assert name == data["type"]
        EVENTS.validate_python(data)  # strict: every required field of that event type
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events]
    assert names[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.output_text.delta"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    deltas = "".join(data["delta"] for name, data in events
                     if name == "response.output_text.delta")
    assert deltas == whole.output_text
    final = Response.model_validate(events[-1][1]["response"])
    assert final.output_text == whole.output_text
    assert final.id == events[0][1]["response"]["id"]

    streamed = [event.type for event in client.responses.create(**body, stream=True)]
    assert streamed == names
    with client.responses.stream(**body) as stream:
        texts = [event.delta for event in stream if event.type == "response.output_text.delta"]
        done = stream.get_final_response()
    assert "".join(texts) == whole.output_text
    assert done.output_text == whole.output_text


def test_a_streamed_cut_off_ends_with_response_incomplete(gateway: GatewayProcess) -> None:
    events = sse_events(gateway, {"model": MODEL, "input": "Tell me a long story.",
                                  "max_output_tokens": 2, "temperature": 0})
    name, data = events[-1]
    assert name == "response.incomplete"
    response = Response.model_validate(data["response"])
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert message_item(response.output[0]).status == "incomplete"


@pytest.mark.parametrize(("extra", "param"), [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp_abc"}, "previous_response_id"),
    ({"conversation": "conv_abc"}, "conversation"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice.type"),
    ({"include": ["reasoning.encrypted_content", "file_search_call.results"]},
     "include[1]"),
    ({"reasoning": {"effort": "max"}}, "reasoning.effort"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"temperature": "warm"}, "temperature"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image",
                                              "image_url": "https://x/y.png"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": "hi", "colour": "red"}]}, "input[0].colour"),
])
def test_bad_and_unsupported_fields_are_a_400_naming_them(
        gateway: GatewayProcess, extra: dict[str, Any], param: str) -> None:
    raw = post(gateway, {"model": MODEL, "input": PARIS, **extra})
    assert raw.status_code == 400, raw.text
    assert raw.json()["error"]["param"] == param


def test_store_false_and_empty_include_are_accepted_and_stored_responses_are_not(
        gateway: GatewayProcess, client: OpenAI) -> None:
    response = client.responses.create(model=MODEL, input=PARIS, store=False,
                                       include=["reasoning.encrypted_content"],
                                       max_output_tokens=2, truncation="disabled")
    assert response.status in ("completed", "incomplete")
    got = httpx.get(f"{gateway.url}/v1/responses/{response.id}", timeout=10)
    assert got.status_code == 404
    assert got.json()["error"]["code"] == "response_not_found"


WEATHER_ARGS = {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"], "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "The weather in a city",
     "parameters": WEATHER_ARGS, "strict": True},
    {"type": "function", "name": "get_time", "description": "The local time in a city",
     "parameters": WEATHER_ARGS, "strict": True},
]


def test_a_named_tool_choice_returns_a_function_call_whose_arguments_validate(
        gateway: GatewayProcess) -> None:
    raw = post(gateway, {"model": MODEL, "input": "What is the weather in Paris?",
                         "tools": TOOLS, "tool_choice": {"type": "function",
                                                         "name": "get_weather"},
                         "max_output_tokens": 48, "temperature": 0})
    assert raw.status_code == 200, raw.text
    response = Response.model_validate(raw.json())
    assert response.status == "completed"
    [call] = [call_item(item) for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather"
    assert call.call_id
    assert call.id
    assert call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER_ARGS)
    assert response.tool_choice.type == "function"  # type: ignore[union-attr]


def test_required_tool_choice_streams_calls_the_sdk_assembles(client: OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="What time is it in Tokyo?",
                                 tools=TOOLS, tool_choice="required",
                                 max_output_tokens=64, temperature=0) as stream:
        events = list(stream)
        done = stream.get_final_response()
    calls = [call_item(item) for item in done.output if item.type == "function_call"]
    assert calls
    for call in calls:
        assert call.name in ("get_weather", "get_time")
        jsonschema.validate(json.loads(call.arguments), WEATHER_ARGS)
        deltas = "".join(e.delta for e in events
                         if e.type == "response.function_call_arguments.delta"
                         and e.item_id == call.id)
        [finished] = [e for e in events if e.type == "response.function_call_arguments.done"
                      and e.item_id == call.id]
        assert deltas == finished.arguments == call.arguments
    assert len({call.call_id for call in calls}) == len(calls)


def test_include_logprobs_puts_them_on_the_output_text(client: OpenAI) -> None:
    response = client.responses.create(model=MODEL, input=PARIS, max_output_tokens=6,
                                       temperature=0, top_logprobs=2,
                                       include=["message.output_text.logprobs"])
    part = text_part(response.output[0])
    assert part.logprobs is not None
    assert response.usage is not None
    assert len(part.logprobs) == response.usage.output_tokens
    assert "".join(lp.token for lp in part.logprobs) == part.text
    for lp in part.logprobs:
        assert lp.logprob <= 0.0
        assert bytes(lp.bytes).decode("utf-8", "replace") == lp.token
        assert len(lp.top_logprobs) == 2


def test_a_job_cancelled_mid_stream_ends_with_response_failed(gateway: GatewayProcess) -> None:
    body = {"model": MODEL, "input": "Count from 1 to 500, separated by commas.",
            "max_output_tokens": 400, "temperature": 0, "stream": True}
    events: list[tuple[str, Any]] = []
    with httpx.stream("POST", f"{gateway.url}/v1/responses", json=body,
                      timeout=120) as response:
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[6:])))
                if name == "response.output_text.delta" and len(events) == 5:
                    job_id = events[0][1]["response"]["id"].removeprefix("resp_")
                    cancel = httpx.post(f"{gateway.url}/v1/jobs/{job_id}/cancel", timeout=10)
                    assert cancel.status_code == 200
    for _, data in events:
        EVENTS.validate_python(data)
    name, data = events[-1]
    assert name == "response.failed"
    failed = Response.model_validate(data["response"])
    assert failed.status == "failed"
    assert failed.error is not None
    assert failed.error.code == "server_error"
    assert message_item(failed.output[0]).status == "incomplete"
