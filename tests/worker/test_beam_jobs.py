"""Beam search through the queue: a real worker returns the n best beams, whole, with
their scores, exactly what the offline engine returns for the same request."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.worker_process import WorkerProcess

from kvrelay import Client
from kvrelay_worker.engine import LLM, SamplingParams

PROMPT = [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47]


@pytest.mark.integration
def test_beams_arrive_whole_with_their_scores(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        tiny_model: Callable[[str], Path]) -> None:
    start_worker("beams", concurrency=4)
    options = {"prompt_token_ids": PROMPT, "max_tokens": 10, "ignore_eos": True,
               "beam_width": 3, "n": 2, "length_penalty": 0.8}
    with Client(clean_redis_url, model="llama-mqa") as client:
        done = client.generate(**options)
        with client.stream(**options) as stream:
            chunks = list(stream)
    offline = LLM(str(tiny_model("llama-mqa")), device="cpu", dtype="float32").generate(
        [PROMPT], SamplingParams(max_tokens=10, ignore_eos=True, beam_width=3, n=2,
                                 length_penalty=0.8))[0]
    assert [c.token_ids for c in done.choices] == [c.token_ids for c in offline.choices]
    scores = [c.beam_score for c in done.choices]
    assert all(s is not None for s in scores)
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    for got, want in zip(scores, (c.beam_score for c in offline.choices), strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    # Nothing streams before the search ends: each beam arrives in one chunk.
    assert sorted((c.index, c.token_ids) for c in chunks) == [
        (c.index, c.token_ids) for c in done.choices]
