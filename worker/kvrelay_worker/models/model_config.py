"""The architecture facts the decoder needs, whatever file format they came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """One Llama-family decoder's shape (Llama 2/3, Mistral, Qwen2/2.5, SmolLM2).

    Field names follow Hugging Face's ``config.json`` so a folder's config maps directly;
    the GGUF reader fills the same fields from the file's metadata.
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
    # "llama", "mistral", "qwen2": kept for messages and for writing config.json back.
    model_type: str = "llama"
    # Sliding-window attention is not implemented; a config that needs it is refused.
    sliding_window: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim
