"""What each GGUF architecture means: its tensor names and its family's config fields.

Facts from llama.cpp (``convert_hf_to_gguf.py`` writes the files, ``src/models/*.cpp``
reads them), which is what a GGUF's metadata means whoever wrote it:

- ``llama`` files hold Llama, Mistral and Mixtral; Mixtral states ``llama.expert_count``
  and stacks its experts (``ffn_{gate,up,down}_exps``, one 3-D tensor per projection,
  experts outermost) beside the router ``ffn_gate_inp``. Only ``llama`` files have q/k
  rows permuted.
- ``qwen3moe``: every layer routes (llama.cpp has no dense layer there), the experts'
  width is ``expert_feed_forward_length``, and llama.cpp always renormalises the top-k
  weights (as Mixtral) unless ``expert_weights_norm`` says otherwise; so does the reader.
- ``gemma2``/``gemma3``: norm weights are stored plus one (HF stores them minus one;
  the converter adds 1), the LM head is always the embedding (the converter drops an
  untied one), ``ffn_norm`` is the pre-feedforward norm and ``post_attention_norm`` /
  ``post_ffw_norm`` the sandwich norms. ``query_pre_attn_scalar`` is not stored:
  llama.cpp scales scores by ``head_dim ** -0.5``, or ``(hidden / heads) ** -0.5`` for
  the 27B models (46 layers for Gemma 2, 62 for Gemma 3), their published values. Windows
  follow ``attention.sliding_window_pattern`` (a period, or one flag per layer), else
  every 2nd (Gemma 2) or 6th (Gemma 3) layer is global; Gemma 2 defaults to a 4096 window
  and caps 50/30; Gemma 3 windows only with a window stated, rotates windowed layers with
  ``rope.freq_base_swa`` (default 10000) and no scaling.
- ``phi3``: q/k/v fused in ``attn_qkv`` and gate/up in ``ffn_up`` (gate rows first),
  exactly Phi-3's own ``qkv_proj``/``gate_up_proj``; a window of 0 means none; long-context
  RoPE is the ``rope_factors_long``/``rope_factors_short`` tensors (HF's ``longrope``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvrelay_worker.models.errors import UnsupportedModelError

# GGUF block tensor (``blk.N.<part>``) -> Hugging Face module under ``model.layers.N.``
_DENSE_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3's and Gemma 3's per-head q/k RMSNorm
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_QWEN_MOE_BLOCK = {**_DENSE_BLOCK, "ffn_gate_inp": "mlp.gate"}
_MIXTRAL_BLOCK = {**_DENSE_BLOCK, "ffn_gate_inp": "block_sparse_moe.gate"}
_GEMMA_BLOCK = {**_DENSE_BLOCK, "ffn_norm": "pre_feedforward_layernorm",
                "post_attention_norm": "post_attention_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"}
_PHI3_BLOCK = {**_DENSE_BLOCK, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
# Stacked experts -> each slice's HF module, as the family's checkpoints spell it (so that
# transformers reads the converted folder too); ``{e}`` is the expert
_QWEN_EXPERTS = {"ffn_gate_exps": "mlp.experts.{e}.gate_proj",
                 "ffn_up_exps": "mlp.experts.{e}.up_proj",
                 "ffn_down_exps": "mlp.experts.{e}.down_proj"}
_MIXTRAL_EXPERTS = {"ffn_gate_exps": "block_sparse_moe.experts.{e}.w1",
                    "ffn_up_exps": "block_sparse_moe.experts.{e}.w3",
                    "ffn_down_exps": "block_sparse_moe.experts.{e}.w2"}

# Reads a metadata value by its key without the ``<arch>.`` prefix.
Meta = Callable[[str, Any], Any]


@dataclass(frozen=True)
class GGUFArchitecture:
    """One ``general.architecture``: its tensor names and how its config is read."""

    name: str
    block_tensors: Mapping[str, str]
    expert_tensors: Mapping[str, str] = field(default_factory=dict)
    permuted_qk: bool = False  # llama.cpp interleaved each head's q/k rotary halves
    norm_offset: float = 0.0  # what llama.cpp added to every norm weight
    # (metadata reader, layers, hidden size, head_dim, source) -> ModelConfig fields
    fields: Callable[[Meta, int, int, int, str], dict[str, Any]] | None = None


def _pattern(meta: Meta, layers: int, period: int) -> tuple[bool, ...]:
    """Windowed layers: flags per layer, or a period whose last layer is global."""
    stated = meta("attention.sliding_window_pattern", None)
    if isinstance(stated, list):
        if len(stated) != layers:
            raise UnsupportedModelError(f"sliding_window_pattern has {len(stated)} flags for "
                                        f"{layers} layers")
        return tuple(bool(flag) for flag in stated)
    period = int(stated) if stated is not None else period
    return tuple(period == 0 or i % period < period - 1 for i in range(layers))


def _windows(window: Any, flags: tuple[bool, ...]) -> dict[str, Any]:
    if not window or not any(flags):
        return {"sliding_window": None, "sliding_layers": ()}
    return {"sliding_window": int(window), "sliding_layers": flags}


def _gemma_common(meta: Meta, layers: int, hidden: int, head_dim: int, layers_27b: int
                  ) -> dict[str, Any]:
    heads = int(meta("attention.head_count", 1))
    scalar = hidden // heads if layers == layers_27b else head_dim
    return {
        "sandwich_norms": True,
        "embedding_multiplier": hidden**0.5,
        "norm_weight_offset": 1.0,
        "hidden_act": "gelu_pytorch_tanh",
        "attention_scale": float(scalar) ** -0.5,
    }


def _optional_float(value: Any) -> float | None:
    return None if value is None or float(value) == 0.0 else float(value)


def _gemma2(meta: Meta, layers: int, hidden: int, head_dim: int, source: str) -> dict[str, Any]:
    base = meta("rope.freq_base", 10000.0)
    local = meta("rope.freq_base_swa", base)
    return {
        **_gemma_common(meta, layers, hidden, head_dim, 46),
        "attn_logit_softcapping": _optional_float(meta("attn_logit_softcapping", 50.0)),
        "final_logit_softcapping": _optional_float(meta("final_logit_softcapping", 30.0)),
        "local_rope_theta": None if local == base else float(local),
        **_windows(meta("attention.sliding_window", 4096), _pattern(meta, layers, 2)),
    }


def _gemma3(meta: Meta, layers: int, hidden: int, head_dim: int, source: str) -> dict[str, Any]:
    window = meta("attention.sliding_window", None)
    fields = {
        **_gemma_common(meta, layers, hidden, head_dim, 62),
        "qk_norm": True,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": _optional_float(meta("final_logit_softcapping", None)),
        **_windows(window, _pattern(meta, layers, 6)),
    }
    if fields["sliding_layers"]:
        fields["local_rope_theta"] = float(meta("rope.freq_base_swa", 10000.0))
    return fields


def _phi3(meta: Meta, layers: int, hidden: int, head_dim: int, source: str) -> dict[str, Any]:
    return _windows(meta("attention.sliding_window", None), (True,) * layers)


def _experts(meta: Meta, layers: int, width_key: str) -> dict[str, Any]:
    experts = int(meta("expert_count", 0))
    used = int(meta("expert_used_count", 0))
    return {
        "num_experts": experts,
        "num_experts_per_tok": used,
        "moe_intermediate_size": int(meta(width_key, 0)),
        "norm_topk_prob": bool(meta("expert_weights_norm", True)),
        "moe_layers": (True,) * layers,
    }


def _llama(meta: Meta, layers: int, hidden: int, head_dim: int, source: str) -> dict[str, Any]:
    if not meta("expert_count", 0):
        return {}
    if meta("leading_dense_block_count", 0):
        raise UnsupportedModelError(f"{source}: dense layers before the experts")
    return {"model_type": "mixtral", **_experts(meta, layers, "feed_forward_length")}


def _qwen3moe(meta: Meta, layers: int, hidden: int, head_dim: int, source: str
              ) -> dict[str, Any]:
    return {"model_type": "qwen3_moe", "qk_norm": True,
            **_experts(meta, layers, "expert_feed_forward_length")}


ARCHITECTURES: dict[str, GGUFArchitecture] = {
    arch.name: arch for arch in (
        GGUFArchitecture("llama", _MIXTRAL_BLOCK, _MIXTRAL_EXPERTS, permuted_qk=True,
                         fields=_llama),
        GGUFArchitecture("qwen2", _DENSE_BLOCK),
        GGUFArchitecture("qwen3", _DENSE_BLOCK),
        GGUFArchitecture("qwen3moe", _QWEN_MOE_BLOCK, _QWEN_EXPERTS, fields=_qwen3moe),
        GGUFArchitecture("gemma2", _GEMMA_BLOCK, norm_offset=1.0, fields=_gemma2),
        GGUFArchitecture("gemma3", _GEMMA_BLOCK, norm_offset=1.0, fields=_gemma3),
        GGUFArchitecture("phi3", _PHI3_BLOCK, fields=_phi3),
    )
}
