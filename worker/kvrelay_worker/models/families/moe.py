"""Mixtral and Qwen3-MoE: pre-norm decoders whose MLPs route tokens to top-k experts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.models.family import ModelFamily, every_layer, sliding_fields


def _mixtral_fields(raw: Mapping[str, Any], layers: int, source: str) -> dict[str, Any]:
    # Mixtral renormalises the chosen experts' weights; every layer is sparse.
    return {
        "num_experts": int(raw.get("num_local_experts", 8)),
        "num_experts_per_tok": int(raw.get("num_experts_per_tok", 2)),
        "moe_intermediate_size": int(raw["intermediate_size"]),
        "norm_topk_prob": True,
        "moe_layers": (True,) * layers,
        **sliding_fields(raw, layers, every_layer),
    }


def _qwen3_moe_fields(raw: Mapping[str, Any], layers: int, source: str) -> dict[str, Any]:
    # transformers 5 writes num_local_experts; Qwen's own configs say num_experts.
    experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 128)
    step = int(raw.get("decoder_sparse_step", 1))
    dense = set(raw.get("mlp_only_layers") or ())
    if step < 1:
        raise UnsupportedModelError(f"{source}: decoder_sparse_step must be at least 1")
    moe_layers = tuple(i not in dense and experts > 0 and (i + 1) % step == 0
                       for i in range(layers))
    bias = bool(raw.get("attention_bias", False))
    window = raw.get("sliding_window") if raw.get("use_sliding_window", False) else None
    return {
        "qk_norm": True,
        "attention_bias": bias,
        "attention_output_bias": bias,
        "num_experts": experts,
        "num_experts_per_tok": int(raw.get("num_experts_per_tok", 8)),
        "moe_intermediate_size": int(raw.get("moe_intermediate_size", 768)),
        "norm_topk_prob": bool(raw.get("norm_topk_prob", False)),
        "moe_layers": moe_layers,
        # Qwen3-MoE windows every layer when use_sliding_window is on.
        **sliding_fields({**raw, "sliding_window": window}, layers, every_layer),
    }


MIXTRAL = ModelFamily("mixtral", "Mixtral", ("MixtralForCausalLM",), ("mixtral",),
                      _mixtral_fields, default_max_positions=4096 * 32,
                      formats=("safetensors", "gguf"),
                      examples="Mixtral-8x7B")
QWEN3_MOE = ModelFamily("qwen3_moe", "Qwen3-MoE", ("Qwen3MoeForCausalLM",), ("qwen3_moe",),
                        _qwen3_moe_fields, default_max_positions=32768,
                        formats=("safetensors", "gguf"),
                        examples="Qwen3-30B-A3B")
