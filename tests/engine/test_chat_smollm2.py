"""The real SmolLM2-135M-Instruct answers a simple question through ``LLM.chat``."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.engine_run import one_torch_thread

from kvrelay_worker.engine import LLM, SamplingParams


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france(smollm2_folder: Path) -> None:
    # ``smollm2_folder`` makes sure the model is prepared in the cache (or skips).
    with one_torch_thread():
        llm = LLM("smollm2-135m-instruct", device="cpu", dtype="float32", num_kv_blocks=64)
        (out,) = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                          SamplingParams(max_tokens=32, temperature=0))
    assert "Paris" in out.text, out.text
    assert out.finish_reason in ("stop", "length")
    stats = llm.engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"]
