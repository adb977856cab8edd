"""The two layer shapes the families use, around the shared attention and MLP blocks.

- ``PreNormLayer`` (Llama, Mistral, Qwen2/3, Phi-3, Mixtral, Qwen3-MoE): norm, attention,
  residual add, norm, MLP (dense or mixture of experts), residual add.
- ``SandwichNormLayer`` (Gemma 2/3): the same, with a second norm after attention and
  after the MLP, before each residual add.

Both carry the residual stream separately and fold the add into the next norm
(``fused_add_rms_norm``), so a layer returns ``(output, residual)``.
"""

from __future__ import annotations

import torch
from torch import nn

from kvrelay_worker.models.attention import AttentionMetadata
from kvrelay_worker.models.layers import GatedMLP, RMSNorm
from kvrelay_worker.models.model_config import ModelConfig
from kvrelay_worker.models.moe import SparseMoE
from kvrelay_worker.models.self_attention import SelfAttention


def make_mlp(config: ModelConfig, layer: int) -> nn.Module:
    if config.is_moe_layer(layer):
        return SparseMoE(config)
    return GatedMLP(config.hidden_size, config.intermediate_size, config.mlp_bias,
                    config.hidden_act)


class PreNormLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, cos_sin_cache: torch.Tensor) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SelfAttention(config, layer, cos_sin_cache)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = make_mlp(config, layer)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None, meta: AttentionMetadata
                ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, normed, meta)
        normed, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(normed), residual


class SandwichNormLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, cos_sin_cache: torch.Tensor) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(size, eps)
        self.self_attn = SelfAttention(config, layer, cos_sin_cache)
        self.post_attention_layernorm = RMSNorm(size, eps)
        self.pre_feedforward_layernorm = RMSNorm(size, eps)
        self.mlp = make_mlp(config, layer)
        self.post_feedforward_layernorm = RMSNorm(size, eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None, meta: AttentionMetadata
                ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm.normalize(self.self_attn(positions, normed, meta))
        normed, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm.normalize(self.mlp(normed)), residual
