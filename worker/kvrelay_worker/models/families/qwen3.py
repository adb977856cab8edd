"""Qwen3: Llama's layout with a per-head RMSNorm on q and k before RoPE."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvrelay_worker.models.family import ModelFamily, qwen_sliding


def _fields(raw: Mapping[str, Any], layers: int, source: str) -> dict[str, Any]:
    bias = bool(raw.get("attention_bias", False))
    return {"qk_norm": True, "attention_bias": bias, "attention_output_bias": bias,
            **qwen_sliding(raw, layers)}


QWEN3 = ModelFamily("qwen3", "Qwen3", ("Qwen3ForCausalLM",), ("qwen3",), _fields,
                    default_max_positions=32768, formats=("safetensors", "gguf"),
                    examples="Qwen3-0.6B")
