"""``quantization="auto"``: a GGUF file on CPU keeps its quantized blocks, anything else
gets float weights; explicit choices pass through."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.engine_model import resolve_quantization
from kvrelay_worker.engine.llm import LLM
from kvrelay_worker.models.quantized_linear import QuantizedLinear
from kvrelay_worker.settings import WorkerSettings


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


def test_the_offline_default_is_the_workers() -> None:
    """``LLM()`` and a worker left at its defaults pick the same weights for a model."""
    default = inspect.signature(LLM).parameters["quantization"].default
    assert default == WorkerSettings().quantization == "auto"


def test_a_default_engine_on_a_gguf_keeps_its_blocks(smollm2_gguf: Path) -> None:
    """No ``quantization`` given: the default GGUF is served kept quantized on CPU, as a
    default worker serves it, not dequantised to float32 (a third of the speed)."""
    llm = LLM("smollm2-135m-instruct", device="cpu", dtype="float32",
              num_kv_blocks=8, max_num_seqs=1)
    assert llm.engine.config.quantization == "gguf"
    assert isinstance(llm.engine.model.lm_head, QuantizedLinear)


def test_a_default_engine_on_a_folder_keeps_float_weights(
        tiny_model: Callable[[str], Path]) -> None:
    llm = LLM(str(tiny_model("llama-mqa")), device="cpu", num_kv_blocks=8, max_num_seqs=1)
    assert llm.engine.config.quantization == "none"
    assert not isinstance(llm.engine.model.lm_head, QuantizedLinear)
