"""The architecture facts the decoder needs, whatever file format they came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """One decoder's shape, whichever family it is (``models/families`` lists them).

    Field names follow Hugging Face's ``config.json`` so a folder's config maps directly;
    the GGUF reader fills the same fields from the file's metadata. The fields after
    ``model_type`` are the switches that tell the families apart; their defaults are the
    Llama behaviour, so a Llama config sets none of them.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # Hugging Face's rope scaling dict (``{"rope_type": "llama3", "factor": 8.0, ...}``),
    # or None for plain RoPE.
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    # Qwen2 puts a bias on q/k/v; Llama and Mistral do not.
    attention_bias: bool = False
    # o_proj has a bias too: Llama's ``attention_bias=True`` biases q, k, v *and* o
    # (Qwen2 biases q, k, v only).
    attention_output_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    # The family ("llama", "qwen3", "gemma2", ...): picks the decoder layer and names.
    model_type: str = "llama"
    # Sliding-window attention: windowed layers see the last ``sliding_window`` tokens
    # (their own included). ``sliding_layers`` marks them; empty means none is windowed.
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    # Gemma 3 rotates its windowed layers with a different base than its global ones.
    local_rope_theta: float | None = None
    hidden_act: str = "silu"
    # Qwen3 and Gemma 3 normalise each head's q and k (RMSNorm over head_dim) before RoPE.
    qk_norm: bool = False
    # None: head_dim ** -0.5; Gemma scales by query_pre_attn_scalar ** -0.5 instead.
    attention_scale: float | None = None
    # Gemma 2: tanh soft-capping of attention scores and of the final logits.
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    # Gemma multiplies embeddings by sqrt(hidden_size) and stores norm weights minus one.
    embedding_multiplier: float | None = None
    norm_weight_offset: float = 0.0
    # Gemma's four norms per layer (before and after attention and MLP) vs Llama's two.
    sandwich_norms: bool = False
    # Mixture of experts: layers marked in ``moe_layers`` route each token to the
    # ``num_experts_per_tok`` best of ``num_experts`` gated MLPs of ``moe_intermediate_size``.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: tuple[bool, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

        for name, flags in (("sliding_layers", self.sliding_layers),
                            ("moe_layers", self.moe_layers)):
            if flags and len(flags) != self.num_hidden_layers:
                raise ValueError(f"{name} has {len(flags)} entries for "
                                 f"{self.num_hidden_layers} layers")
        if any(self.sliding_layers) and not self.sliding_window:
            raise ValueError("sliding_layers marks windowed layers but sliding_window is unset")
        if any(self.moe_layers) and not (0 < self.num_experts_per_tok <= self.num_experts):
            raise ValueError("a mixture of experts needs 0 < num_experts_per_tok <= num_experts")

    def window_of(self, layer: int) -> int | None:
        """The layer's attention window, or None when it sees the whole context."""
        if self.sliding_layers and self.sliding_layers[layer]:
            return self.sliding_window
        return None

    def is_moe_layer(self, layer: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[layer]

    @property
    def kv_window(self) -> int | None:
        """The window every layer shares, or None if some layer sees the whole context.

        Only then can a sequence's early KV blocks be freed: one block table serves all
        layers, so a block stays while any layer may still read it.
        """
        if self.sliding_layers and all(self.sliding_layers):
            return self.sliding_window
        return None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim
