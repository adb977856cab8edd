"""``quantization="auto"``: a GGUF file on CPU keeps its quantized blocks, anything else
gets float weights; explicit choices pass through."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.engine_model import resolve_quantization
from kvrelay_worker.engine.llm import LLM
from kvrelay_worker.models.quantized_linear import QuantizedLinear


@pytest.mark.parametrize(("quantization", "kind", "expected"), [
    ("auto", "gguf", "gguf"),
    ("auto", "hf_folder", "none"),
    ("none", "gguf", "none"),
    ("int8", "gguf", "int8"),
    (None, "gguf", "none"),
])
def test_auto_is_decided_by_source_on_cpu(quantization: str | None, kind: str,
                                          expected: str) -> None:
    config = EngineConfig(model="m", device="cpu", quantization=quantization)
    assert resolve_quantization(config, kind) == expected


def test_an_auto_engine_on_a_gguf_keeps_its_blocks(smollm2_gguf: Path) -> None:
    llm = LLM("smollm2-135m-instruct", device="cpu", dtype="float32", quantization="auto",
              num_kv_blocks=8, max_num_seqs=1)
    assert llm.engine.config.quantization == "gguf"
    assert isinstance(llm.engine.model.lm_head, QuantizedLinear)
