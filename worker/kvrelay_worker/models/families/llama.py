"""Llama 2/3, Mistral, Qwen2/2.5 and SmolLM2: one pre-norm decoder, differences in config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvrelay_worker.models.family import ModelFamily, every_layer, qwen_sliding, sliding_fields


def _llama_fields(raw: Mapping[str, Any], layers: int, source: str) -> dict[str, Any]:
    # Llama's single attention_bias switch covers q/k/v and o.
    bias = bool(raw.get("attention_bias", False))
    return {"attention_bias": bias, "attention_output_bias": bias,
            "mlp_bias": bool(raw.get("mlp_bias", False))}


def _mistral_fields(raw: Mapping[str, Any], layers: int, source: str) -> dict[str, Any]:
    raw = {"sliding_window": 4096, **raw}  # transformers' default when the key is absent
    return sliding_fields(raw, layers, every_layer)


def _qwen2_fields(raw: Mapping[str, Any], layers: int, source: str) -> dict[str, Any]:
    # Qwen2 always biases q/k/v, never o.
    return {"attention_bias": True, **qwen_sliding(raw, layers)}


LLAMA = ModelFamily("llama", "Llama 2/3", ("LlamaForCausalLM",), ("llama",), _llama_fields,
                    default_max_positions=2048, formats=("safetensors", "gguf"),
                    examples="Llama 3.x, SmolLM2")
MISTRAL = ModelFamily("mistral", "Mistral", ("MistralForCausalLM",), ("mistral",),
                      _mistral_fields, default_max_positions=4096 * 32,
                      examples="Mistral 7B (sliding window 4096 in v0.1)")
QWEN2 = ModelFamily("qwen2", "Qwen2/2.5", ("Qwen2ForCausalLM",), ("qwen2",), _qwen2_fields,
                    default_max_positions=32768, formats=("safetensors", "gguf"),
                    examples="Qwen2.5-0.5B-Instruct")
