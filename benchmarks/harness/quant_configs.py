"""The configurations the quantization benchmarks compare: one LLM keyword dict each.

``quant.py`` and ``quality.py`` run every row; adding a row (say another engineer's KV
cache dtype) is one line. A row whose keyword this engine does not take is skipped with a
printed note instead of failing the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL = "smollm2-135m-instruct"  # the Q4_1 GGUF, dequantised to float32 unless kept

# label -> LLM(...) keywords. "float32" is the baseline: today's dequantised GGUF.
CONFIGS: dict[str, dict[str, Any]] = {
    "float32": {"quantization": "none"},
    "int8": {"quantization": "int8"},
    "int4-g32": {"quantization": "int4", "quantization_group_size": 32},
    "gguf-kept (Q4_1)": {"quantization": "gguf"},
    "kv-int8": {"kv_cache_dtype": "int8"},
    # the same float32 weights quantized by llmcompressor (FP8 kept as stored)
    "fp8-dynamic (llmcompressor)": {"quantization": "none", "checkpoint": "FP8_DYNAMIC"},
}


def llmcompressor_checkpoint(scheme: str) -> Path:
    """MODEL's float32 folder quantized by llmcompressor with ``scheme``: the tests'
    recipe and cache (``tests/helpers/compressed_checkpoints.py``), made once."""
    from harness.repository import load_repository_module
    from kvrelay_worker.loading import prepare_model

    helpers = load_repository_module("tests/helpers/compressed_checkpoints.py")
    folder: Path = helpers.cached_checkpoints(prepare_model(MODEL, progress=False), [scheme])
    return folder / scheme


def make_llm(label: str, **engine_options: Any) -> Any:
    """The LLM of one row, or None (with a note) when this engine rejects its keywords."""
    from kvrelay_worker.engine import EngineConfigError
    from kvrelay_worker.engine.llm import LLM

    options = {"device": "cpu", "dtype": "float32", **engine_options, **CONFIGS[label]}
    checkpoint = options.pop("checkpoint", None)
    model = MODEL if checkpoint is None else str(llmcompressor_checkpoint(checkpoint))
    try:
        return LLM(model, **options)
    except (TypeError, EngineConfigError) as exc:
        print(f"note: skipping {label!r}: this engine rejects {CONFIGS[label]} ({exc})")
        return None
