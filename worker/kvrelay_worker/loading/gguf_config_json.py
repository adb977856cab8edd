"""The ``config.json`` of a converted GGUF for the families beyond Llama/Qwen (Gemma 2/3,
Phi-3, Mixtral, Qwen3-MoE).

The float path writes a GGUF's config into the cache folder and reads it back with the
family readers (``models/families``), so each writer here spells exactly the keys its
reader takes, in transformers 5's form (``layer_types`` for windows, Gemma 3's
``rope_parameters`` per attention kind), which transformers builds the same model from.
What a family's ``config.json`` cannot say is refused rather than written wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.models.model_config import ModelConfig


def base_config_json(config: ModelConfig, architecture: str, model_type: str, dtype: str
                     ) -> dict[str, Any]:
    """The keys every family's ``config.json`` spells the same way (``hf_folder`` writes
    Llama/Qwen files from it too)."""
    eos = list(config.eos_token_ids)
    out: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": (eos[0] if len(eos) == 1 else eos) or None,
        "pad_token_id": config.pad_token_id,
        "torch_dtype": dtype,
    }
    if config.rope_scaling is not None:
        out["rope_scaling"] = dict(config.rope_scaling)
    return out


def _common(config: ModelConfig, architecture: str, model_type: str, dtype: str
            ) -> dict[str, Any]:
    out = base_config_json(config, architecture, model_type, dtype)
    out.update(attention_bias=config.attention_bias, sliding_window=config.sliding_window)
    if config.sliding_layers:
        out["layer_types"] = ["sliding_attention" if flag else "full_attention"
                              for flag in config.sliding_layers]
    if config.attention_bias != config.attention_output_bias or config.mlp_bias:
        raise UnsupportedModelError(f"{model_type}: biases on only some projections")
    return out


def _query_pre_attn_scalar(config: ModelConfig) -> float | int:
    scalar = round((config.attention_scale or config.head_dim**-0.5) ** -2, 4)
    return int(scalar) if scalar == int(scalar) else scalar


def _gemma2(config: ModelConfig, dtype: str) -> dict[str, Any]:
    if config.local_rope_theta is not None:
        raise UnsupportedModelError("gemma2 with its own base for windowed layers")
    out = _common(config, "Gemma2ForCausalLM", "gemma2", dtype)
    return {**out, "hidden_activation": config.hidden_act,
            "query_pre_attn_scalar": _query_pre_attn_scalar(config),
            "attn_logit_softcapping": config.attn_logit_softcapping,
            "final_logit_softcapping": config.final_logit_softcapping}


def _gemma3(config: ModelConfig, dtype: str) -> dict[str, Any]:
    out = _common(config, "Gemma3ForCausalLM", "gemma3_text", dtype)
    scaling = dict(out.pop("rope_scaling", None) or {"rope_type": "default"})
    local = config.local_rope_theta if config.local_rope_theta is not None else 10000.0
    out["rope_parameters"] = {
        "full_attention": {**scaling, "rope_theta": config.rope_theta},
        "sliding_attention": {"rope_type": "default", "rope_theta": local},
    }
    return {**out, "hidden_activation": config.hidden_act,
            "query_pre_attn_scalar": _query_pre_attn_scalar(config),
            "attn_logit_softcapping": config.attn_logit_softcapping,
            "final_logit_softcapping": config.final_logit_softcapping,
            "use_bidirectional_attention": False}


def _phi3(config: ModelConfig, dtype: str) -> dict[str, Any]:
    out = _common(config, "Phi3ForCausalLM", "phi3", dtype)
    if config.sliding_layers and not all(config.sliding_layers):
        raise UnsupportedModelError("phi3 windows every layer or none")
    out.pop("layer_types", None)
    if config.rope_scaling and "original_max_position_embeddings" in config.rope_scaling:
        out["original_max_position_embeddings"] = (
            config.rope_scaling["original_max_position_embeddings"])
    return out


def _mixtral(config: ModelConfig, dtype: str) -> dict[str, Any]:
    if not config.norm_topk_prob or not all(config.moe_layers):
        raise UnsupportedModelError("Mixtral renormalises its top-k and routes every layer")
    out = _common(config, "MixtralForCausalLM", "mixtral", dtype)
    out.pop("layer_types", None)
    return {**out, "intermediate_size": config.moe_intermediate_size,
            "num_local_experts": config.num_experts,
            "num_experts_per_tok": config.num_experts_per_tok}


def _qwen3_moe(config: ModelConfig, dtype: str) -> dict[str, Any]:
    out = _common(config, "Qwen3MoeForCausalLM", "qwen3_moe", dtype)
    if config.sliding_layers:
        raise UnsupportedModelError("qwen3_moe with windows")
    return {**out, "num_experts": config.num_experts,
            "num_experts_per_tok": config.num_experts_per_tok,
            "moe_intermediate_size": config.moe_intermediate_size,
            "norm_topk_prob": config.norm_topk_prob, "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i, sparse in enumerate(config.moe_layers) if not sparse],
            "use_sliding_window": False}


WRITERS: dict[str, Callable[[ModelConfig, str], dict[str, Any]]] = {
    "gemma2": _gemma2, "gemma3": _gemma3, "phi3": _phi3, "mixtral": _mixtral,
    "qwen3_moe": _qwen3_moe,
}


def family_config_json(config: ModelConfig, dtype: str) -> dict[str, Any]:
    """The ``config.json`` dict for ``config`` (a family in ``WRITERS``)."""
    try:
        return WRITERS[config.model_type](config, dtype)
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"cannot write a config.json: {exc}") from exc
