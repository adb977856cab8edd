"""Prompt log-probabilities and token bytes through a real worker serving SmolLM2 and the
SDK: once, on the first Tokens event; equal to transformers' float32 log_softmax; every
token (sampled, alternative, prompt) carrying the exact bytes it stands for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.float32_smollm2 import MODEL, float32_smollm2_worker
from helpers.hf_prompt_scores import assert_prompt_logprobs_match, hf_log_softmax
from helpers.hf_reference import load_hf_model
from helpers.worker_process import WorkerProcess
from transformers import AutoTokenizer

from kvrelay import AsyncClient, InvalidRequest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEXT = "Le café coûte 3 € — 東京 is far away, said the naïve fox."
IM_START = 1  # "<|im_start|>": a special token first, so every byte of TEXT is scored


@pytest.fixture(scope="module")
def f32_worker(redis_url: str, smollm2_folder: Path,
                   tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[tuple[str, WorkerProcess]]:
    """SmolLM2 in float32, as transformers computes it (``helpers.float32_smollm2``)."""
    with float32_smollm2_worker(redis_url, smollm2_folder,
                                tmp_path_factory.mktemp("f32-worker"), db=12) as served:
        yield served


@pytest.fixture(scope="module")
def prompt_ids(smollm2_folder: Path) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_folder))
    assert tokenizer.convert_ids_to_tokens(IM_START) == "<|im_start|>"
    return [IM_START, *tokenizer.encode(TEXT)]


async def test_prompt_logprobs_and_token_bytes_reach_the_caller(
        f32_worker: tuple[str, WorkerProcess], smollm2_folder: Path,
        prompt_ids: list[int]) -> None:
    url, _ = f32_worker
    options = {"prompt_token_ids": prompt_ids, "max_tokens": 8, "temperature": 0.0,
               "ignore_eos": True, "logprobs": 2, "prompt_logprobs": 2}
    async with AsyncClient(url, model=MODEL) as client:
        done = await client.generate(**options)  # type: ignore[arg-type]
        chunks = []
        async with client.stream(**options) as stream:  # type: ignore[arg-type]
            async for chunk in stream:
                chunks.append(chunk)

    entries = done.prompt_logprobs
    assert entries is not None
    reference = hf_log_softmax(load_hf_model(smollm2_folder), prompt_ids)
    assert_prompt_logprobs_match(entries, prompt_ids, reference, 2)
    # Joined, the prompt tokens' bytes are the text's UTF-8, character pieces included.
    scored = [e for e in entries[1:] if e is not None]
    assert b"".join(e.token_bytes or b"" for e in scored) == TEXT.encode()
    assert all(t.token_bytes for e in scored for t in e.top)

    sampled = done.logprobs
    assert sampled is not None
    assert len(sampled) == 8
    joined = b"".join(lp.token_bytes or b"" for lp in sampled)
    assert joined.decode("utf-8", "replace") == done.text
    assert [lp.token for lp in sampled] == [
        (lp.token_bytes or b"").decode("utf-8", "replace") for lp in sampled]
    assert all(t.token_bytes for lp in sampled for t in lp.top)

    # Streamed: on the first chunk only, the same values.
    assert chunks[0].prompt_logprobs == entries
    assert all(c.prompt_logprobs is None for c in chunks[1:])


async def test_max_tokens_zero_scores_the_prompt_alone(
        f32_worker: tuple[str, WorkerProcess], smollm2_folder: Path,
        prompt_ids: list[int]) -> None:
    url, _ = f32_worker
    async with AsyncClient(url, model=MODEL) as client:
        done = await client.generate(prompt_token_ids=prompt_ids, max_tokens=0,
                                     prompt_logprobs=0)
        with pytest.raises(InvalidRequest, match="prompt_logprobs"):
            client.stream(prompt_token_ids=prompt_ids, max_tokens=0)
    assert (done.text, done.token_ids, done.finish_reason) == ("", [], "length")
    assert done.usage.completion_tokens == 0
    assert done.usage.prompt_tokens == len(prompt_ids)
    reference = hf_log_softmax(load_hf_model(smollm2_folder), prompt_ids)
    assert_prompt_logprobs_match(done.prompt_logprobs or [], prompt_ids, reference, 0)
