"""Gemma 2 and Gemma 3: four norms per layer, scaled embeddings, local/global attention.

Both multiply embeddings by sqrt(hidden_size), store norm weights minus one, use GELU
(tanh form) and scale scores by ``query_pre_attn_scalar ** -0.5``. Gemma 2 soft-caps
attention scores and final logits and alternates windowed and global layers; Gemma 3 drops
the caps, adds per-head q/k norms, windows five layers in six and rotates its windowed
layers with a smaller base (``rope_parameters.sliding_attention``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.models.family import ModelFamily, rope_from_hf, sliding_fields


def _common(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    if raw.get("use_bidirectional_attention"):
        raise UnsupportedModelError(f"{source}: bidirectional Gemma attention is not supported")
    hidden = int(raw["hidden_size"])
    return {
        "sandwich_norms": True,
        "embedding_multiplier": hidden**0.5,
        "norm_weight_offset": 1.0,
        "hidden_act": str(raw.get("hidden_activation") or raw.get("hidden_act")
                          or "gelu_pytorch_tanh"),
        "attention_scale": float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        "attention_bias": bool(raw.get("attention_bias", False)),
        "attention_output_bias": bool(raw.get("attention_bias", False)),
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", True)),
    }


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _gemma2_fields(raw: Mapping[str, Any], layers: int, source: str) -> dict[str, Any]:
    raw = {"sliding_window": 4096, "attn_logit_softcapping": 50.0,
           "final_logit_softcapping": 30.0, **raw}
    return {
        **_common(raw, source),
        "attn_logit_softcapping": _optional_float(raw["attn_logit_softcapping"]),
        "final_logit_softcapping": _optional_float(raw["final_logit_softcapping"]),
        # Even layers window, odd ones see everything.
        **sliding_fields(raw, layers, lambda i: (i + 1) % 2 == 1),
    }


def _gemma3_rope(raw: Mapping[str, Any], source: str
                 ) -> tuple[float, dict[str, Any] | None, float]:
    """``(global theta, global scaling, local theta)`` from either config spelling."""
    params = raw.get("rope_parameters")
    if isinstance(params, Mapping) and "full_attention" in params:
        theta, scaling = rope_from_hf({"rope_parameters": params["full_attention"]}, source)
        local_theta, local_scaling = rope_from_hf(
            {"rope_parameters": params.get("sliding_attention", {"rope_theta": 10000.0})},
            source)
        if local_scaling is not None:
            raise UnsupportedModelError(f"{source}: scaled RoPE on windowed layers")
        return theta, scaling, local_theta
    theta, scaling = rope_from_hf({"rope_theta": 1_000_000.0, **raw}, source)
    return theta, scaling, float(raw.get("rope_local_base_freq", 10000.0))


def _gemma3_fields(raw: Mapping[str, Any], layers: int, source: str) -> dict[str, Any]:
    raw = {"sliding_window": 4096, **raw}
    pattern = int(raw.get("sliding_window_pattern", 6))
    theta, scaling, local_theta = _gemma3_rope(raw, source)
    return {
        **_common(raw, source),
        "qk_norm": True,
        "attn_logit_softcapping": _optional_float(raw.get("attn_logit_softcapping")),
        "final_logit_softcapping": _optional_float(raw.get("final_logit_softcapping")),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "local_rope_theta": local_theta,
        **sliding_fields(raw, layers, lambda i: (i + 1) % pattern != 0),
    }


GEMMA2 = ModelFamily("gemma2", "Gemma 2", ("Gemma2ForCausalLM",), ("gemma2",),
                     _gemma2_fields, default_max_positions=8192, formats=("safetensors", "gguf"),
                     examples="gemma-2-2b-it")
GEMMA3 = ModelFamily("gemma3", "Gemma 3 (text)", ("Gemma3ForCausalLM",), ("gemma3_text",),
                     _gemma3_fields, default_max_positions=131072,
                     formats=("safetensors", "gguf"),
                     examples="gemma-3-1b-it, gemma-3-270m")
