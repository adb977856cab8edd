"""A GGUF the engine keeps quantized is read from the file: no float32 copy in the cache.

The CPU worker image ships the GGUF and no converted folder; converting at start would
write four times the file and take most of the start. Only a float engine converts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrelay.cli.worker_launch import keeps_gguf_blocks, prepare_if_needed
from kvrelay_worker.engine import LLMEngine
from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.loading import load_model_source
from kvrelay_worker.loading.cache_layout import CACHE_DIR_ENV

SMOLLM2 = "smollm2-135m-instruct"


def _float_copies(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.safetensors"))


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                smollm2_gguf: Path) -> Path:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    return tmp_path


def test_a_cpu_engine_serves_the_gguf_without_converting_it(empty_cache: Path) -> None:
    engine = LLMEngine(EngineConfig(model=SMOLLM2, device="cpu", quantization="auto",
                                    max_model_len=256))
    assert engine.config.quantization == "gguf"
    assert _float_copies(empty_cache) == []
    ids = engine.tokenizer.encode("The capital of France is")
    assert len(ids) > 3  # the tokenizer came from the file


def test_the_float_weights_still_convert_on_demand(empty_cache: Path) -> None:
    files = load_model_source(SMOLLM2, keep_gguf=True)
    assert files.path.suffix == ".gguf"
    assert _float_copies(empty_cache) == []
    _, tensor = next(iter(files.weights()))
    assert tensor.is_floating_point()
    assert [p.name for p in _float_copies(empty_cache)] == ["model.safetensors"]


def test_kvrelay_worker_prepares_only_for_float_weights(empty_cache: Path) -> None:
    """What ``kvrelay worker`` / ``kvrelay up`` do before the worker starts."""
    cpu = {"KVRELAY_DEVICE": "cpu", "KVRELAY_QUANTIZATION": "auto"}
    assert keeps_gguf_blocks(cpu)
    prepare_if_needed(SMOLLM2, cpu)
    assert _float_copies(empty_cache) == []
    floats = {**cpu, "KVRELAY_QUANTIZATION": "none"}
    assert not keeps_gguf_blocks(floats)
    prepare_if_needed(SMOLLM2, floats)
    assert len(_float_copies(empty_cache)) == 1
