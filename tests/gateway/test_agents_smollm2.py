"""The ``openai-agents`` package runs a two-tool agent loop against the gateway and a real
SmolLM2 worker: over the Responses API (the package's default model class, whole and
streamed) and over chat completions.

The first turn forces a call (``tool_choice="required"``: the worker decodes it under a
grammar of the tools' schemas); the agent runs the tool, resets the choice (its default)
and sends the result back, and the model's next turn answers in text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
from agents.models.interface import Model
from helpers.gateway_process import GatewayProcess
from helpers.worker_process import WorkerProcess
from openai import AsyncOpenAI

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
QUESTION = "What is the weather in Paris, and what time is it there?"


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
async def openai_client(gateway: GatewayProcess) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                           timeout=120) as client:
        yield client


def two_tool_agent(model: Model, calls: list[tuple[str, str]]) -> Agent[Any]:
    """An agent with two tools that record their calls; its first turn must call one."""

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(("get_weather", city))
        return f"Sunny and 24 degrees Celsius in {city}."

    @function_tool
    def get_time(city: str) -> str:
        """The local time in a city."""
        calls.append(("get_time", city))
        return f"It is 14:05 in {city}."

    return Agent(name="assistant", instructions="Use the tools to answer.",
                 tools=[get_weather, get_time], model=model,
                 model_settings=ModelSettings(tool_choice="required", temperature=0,
                                              max_tokens=64))


def check_the_loop(items: list[Any], calls: list[tuple[str, str]], final: Any) -> None:
    """The forced call ran a tool with a string argument, its output went back to the
    model, and the run ended with a text answer."""
    assert calls
    for name, city in calls:
        assert name in ("get_weather", "get_time")
        assert isinstance(city, str)
    kinds = [type(item) for item in items]
    assert ToolCallItem in kinds
    assert ToolCallOutputItem in kinds
    assert kinds[-1] is MessageOutputItem
    assert kinds.index(ToolCallOutputItem) < len(kinds) - 1
    assert isinstance(final, str)


async def test_agent_loop_over_the_responses_api(openai_client: AsyncOpenAI) -> None:
    calls: list[tuple[str, str]] = []
    agent = two_tool_agent(OpenAIResponsesModel(MODEL, openai_client), calls)
    result = await Runner.run(agent, QUESTION, max_turns=4,
                              run_config=RunConfig(tracing_disabled=True))
    check_the_loop(result.new_items, calls, result.final_output)
    assert len(result.raw_responses) >= 2
    assert all(r.response_id and r.response_id.startswith("resp_")
               for r in result.raw_responses)


async def test_streamed_agent_loop_over_the_responses_api(openai_client: AsyncOpenAI) -> None:
    calls: list[tuple[str, str]] = []
    agent = two_tool_agent(OpenAIResponsesModel(MODEL, openai_client), calls)
    result = Runner.run_streamed(agent, QUESTION, max_turns=4,
                                 run_config=RunConfig(tracing_disabled=True))
    kinds = {event.type async for event in result.stream_events()}
    assert "raw_response_event" in kinds
    check_the_loop(result.new_items, calls, result.final_output)


async def test_agent_loop_over_chat_completions(openai_client: AsyncOpenAI) -> None:
    calls: list[tuple[str, str]] = []
    agent = two_tool_agent(OpenAIChatCompletionsModel(MODEL, openai_client), calls)
    result = await Runner.run(agent, QUESTION, max_turns=4,
                              run_config=RunConfig(tracing_disabled=True))
    check_the_loop(result.new_items, calls, result.final_output)
