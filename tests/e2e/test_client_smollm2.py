"""Every call form of the SDK against a real worker serving SmolLM2 (the default model).

One worker for the module (loading the model takes seconds); its own Redis database.
"""

from __future__ import annotations

import asyncio

import pytest
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient, Client

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def served(smollm2_worker: tuple[str, WorkerProcess]) -> tuple[str, WorkerProcess]:
    return smollm2_worker


async def test_generate_from_prompt_messages_and_token_ids(
        served: tuple[str, WorkerProcess]) -> None:
    url, _ = served
    async with AsyncClient(url, model=MODEL) as client:
        question = ("Why is the sky blue? Explain it to a curious child in simple words, with "
                    "an everyday example, and keep the answer short and friendly.")
        done = await client.generate(question, max_tokens=24, temperature=0.7, seed=1,
                                     min_tokens=4)
        assert done.text
        assert done.finish_reason in ("stop", "length")
        assert done.usage.prompt_tokens > 0
        assert done.usage.completion_tokens == len(done.token_ids) > 0
        assert done.job_id
        again = await client.generate(question, max_tokens=24, temperature=0.7, seed=1,
                                      min_tokens=4)
        assert again.token_ids == done.token_ids  # seeded: the same answer
        assert again.usage.cached_tokens > 0  # and its prompt came from the prefix cache

        chat = await client.generate(
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=32, temperature=0.0)
        assert "Paris" in chat.text

        ids = await client.generate(prompt_token_ids=[1, 2, 3], max_tokens=8, temperature=0.0,
                                    ignore_eos=True)
        assert len(ids.token_ids) == 8
        assert ids.finish_reason == "length"


async def test_stream_chunks_text_stream_and_final(served: tuple[str, WorkerProcess]) -> None:
    url, _ = served
    async with AsyncClient(url, model=MODEL) as client:
        pieces: list[str] = []
        seqs: list[int] = []
        async with client.stream("Tell me a story", max_tokens=40, temperature=0.0,
                                 ignore_eos=True) as stream:
            async for chunk in stream:
                pieces.append(chunk.text)
                seqs.append(chunk.seq)
                assert chunk.token_ids
            final = await stream.final()
        assert "".join(pieces) == final.text
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert len(final.token_ids) == 40

        texts: list[str] = []
        async with client.stream("Tell me a story", max_tokens=40, temperature=0.0,
                                 ignore_eos=True) as stream:
            async for text in stream.text_stream:
                texts.append(text)
        assert "".join(texts) == final.text  # greedy: the same story


async def test_n_choices(served: tuple[str, WorkerProcess]) -> None:
    url, _ = served
    async with AsyncClient(url, model=MODEL) as client:
        done = await client.generate("Name a color.", n=3, max_tokens=12, temperature=1.0,
                                     seed=7, ignore_eos=True)
    assert len(done.choices) == 3
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert all(len(c.token_ids) == 12 for c in done.choices)
    assert len({tuple(c.token_ids) for c in done.choices}) > 1  # sampled, not copies
    assert done.text == done.choices[0].text
    assert done.usage.completion_tokens == 36


async def test_breaking_out_after_three_chunks_frees_the_blocks(
        served: tuple[str, WorkerProcess]) -> None:
    url, worker = served
    async with AsyncClient(url, model=MODEL) as client:
        async with client.stream("Write a very long essay about the ocean.", max_tokens=500,
                                 temperature=0.0, ignore_eos=True) as stream:
            count = 0
            async for _ in stream:
                count += 1
                if count == 3:
                    break
    stats = await asyncio.to_thread(
        worker.wait_for_stats, lambda s: s["free_blocks"] == s["total_blocks"], 15)
    assert stats["running"] == 0


def test_sync_client(served: tuple[str, WorkerProcess]) -> None:
    url, _ = served
    with Client(url, model=MODEL) as client:
        done = client.generate(messages=[{"role": "user", "content": "Hi"}], max_tokens=16,
                               temperature=0.0)
        assert done.text
        with client.stream("Count to five:", max_tokens=16, temperature=0.0) as stream:
            text = "".join(chunk.text for chunk in stream)
        assert text == stream.final().text
