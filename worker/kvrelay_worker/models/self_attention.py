"""The attention sub-layer of every family: fused q/k/v, optional q/k norm, RoPE, o_proj.

What differs between families is configuration read from ``ModelConfig``: biases (Qwen2,
Llama with ``attention_bias``), per-head q/k RMSNorm (Qwen3, Gemma 3), the score scale
(Gemma), logit soft-capping (Gemma 2) and the layer's sliding window.
"""

from __future__ import annotations

import torch
from torch import nn

from kvrelay_kernels import rotary_embedding
from kvrelay_worker.models.attention import Attention, AttentionMetadata
from kvrelay_worker.models.cpu_linear import Linear
from kvrelay_worker.models.layers import RMSNorm
from kvrelay_worker.models.model_config import ModelConfig


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, cos_sin_cache: torch.Tensor) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.kv_size = config.kv_size
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=config.attention_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.attention_output_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.cos_sin_cache = cos_sin_cache
        scale = config.attention_scale or config.head_dim**-0.5
        self.attn = Attention(config.num_attention_heads, config.num_key_value_heads,
                              config.head_dim, scale=scale,
                              sliding_window=config.window_of(layer),
                              softcap=config.attn_logit_softcapping)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and self.k_norm is not None:
            num_tokens = hidden.shape[0]
            q = self.q_norm.normalize(q.reshape(-1, self.head_dim)).view(num_tokens, -1)
            k = self.k_norm.normalize(k.reshape(-1, self.head_dim)).view(num_tokens, -1)
        rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim, is_neox=True)
        return self.o_proj(self.attn(q, k, v, meta))
