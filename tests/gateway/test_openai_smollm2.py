"""The official ``openai`` package against the gateway and a real worker serving SmolLM2.

Sync and async clients, streaming and not, chat and completions, ``n=2``, logprobs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.gateway_process import GatewayProcess
from helpers.worker_process import WorkerProcess
from openai import AsyncOpenAI, OpenAI

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
PARIS = [{"role": "user", "content": "What is the capital of France?"}]


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
    assert usage.prompt_tokens_details.cached_tokens > 0  # the same prompt, from the cache


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
            assert item.token.startswith("token_id:")
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
