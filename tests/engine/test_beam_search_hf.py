"""Beam search equals transformers' ``generate(num_beams=k, do_sample=False)``: the same
beams, token for token, and the same ``sequences_scores`` (float32, CPU, SmolLM2).

Eight short prompts per case, batched in one engine call; cases cover k = 2 and 4,
length penalties above and below 1 and the three ``early_stopping`` rules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.engine_run import assert_engine_idle
from helpers.hf_reference import hf_beam_search, load_hf_model

from kvrelay_worker.engine import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["The capital of France is", "Once upon a time, there was a", "def fibonacci(n):",
         "The three primary colors are", "Water boils at", "My favourite fruit is the",
         "In 1492, Columbus", "The quick brown fox"]

CASES = [  # (k, n, length_penalty, early_stopping, max_new_tokens)
    (2, 2, 0.7, False, 20),
    (4, 3, 1.5, True, 16),
    (2, 1, 1.2, "never", 12),
]


@pytest.fixture(scope="module")
def llm(smollm2_folder: Path) -> LLM:
    return LLM(str(smollm2_folder), device="cpu", dtype="float32", num_kv_blocks=256,
               max_num_seqs=64)


@pytest.fixture(scope="module")
def hf_model(smollm2_folder: Path) -> Any:
    return load_hf_model(smollm2_folder)


@pytest.mark.parametrize(("k", "n", "penalty", "early", "max_new"), CASES)
def test_beams_and_scores_equal_transformers(llm: LLM, hf_model: Any, k: int, n: int,
                                             penalty: float, early: bool | str,
                                             max_new: int) -> None:
    tokenizer = llm.engine.tokenizer
    prompts = [tokenizer.encode(text) for text in TEXTS]
    eos = list(llm.engine.eos_token_ids)
    expected = hf_beam_search(hf_model, prompts, max_new, k, n, penalty, early, eos)
    params = SamplingParams(beam_width=k, n=n, length_penalty=penalty, early_stopping=early,
                            max_tokens=max_new)
    outs = llm.generate(prompts, params)
    for prompt, out, beams in zip(prompts, outs, expected, strict=True):
        got = [(c.token_ids, c.beam_score) for c in out.choices]
        assert [t for t, _ in got] == [t for t, _ in beams], f"prompt {prompt}"
        for (_, score), (_, want) in zip(got, beams, strict=True):
            assert score == pytest.approx(want, abs=1e-4)
        assert [c.index for c in out.choices] == list(range(n))
    assert_engine_idle(llm.engine)
