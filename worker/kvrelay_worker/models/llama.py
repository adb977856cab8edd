"""One Llama-family decoder: Llama 2/3, Mistral, Qwen2/2.5 and SmolLM2.

The differences between them are configuration: head counts (MHA, GQA, MQA), a bias on
the q/k/v projections (Qwen2), tied or separate embeddings, the RoPE variant. Q/K/V and
gate/up are fused into one projection each (one matmul instead of three or two). The
model takes a flattened batch (no padding) and knows nothing about blocks: attention
goes through ``Attention`` and the metadata the runner built.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from kvrelay_kernels import fused_add_rms_norm, rms_norm, rotary_embedding
from kvrelay_worker.models.attention import Attention, AttentionMetadata
from kvrelay_worker.models.model_config import ModelConfig
from kvrelay_worker.models.rotary import build_cos_sin_cache


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(norm(x + residual), x + residual)``; without a residual, ``x`` is it."""
        if residual is None:
            return rms_norm(x, self.weight, self.eps), x
        return fused_add_rms_norm(x, residual, self.weight, self.eps)


class LlamaAttentionBlock(nn.Module):
    def __init__(self, config: ModelConfig, cos_sin_cache: torch.Tensor) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.kv_size = config.kv_size
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=config.attention_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.attention_output_bias)
        self.cos_sin_cache = cos_sin_cache
        self.attn = Attention(config.num_attention_heads, config.num_key_value_heads,
                              config.head_dim, scale=config.head_dim**-0.5)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim, is_neox=True)
        return self.o_proj(self.attn(q, k, v, meta))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size,
                                      bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size,
                                   bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, cos_sin_cache: torch.Tensor) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttentionBlock(config, cos_sin_cache)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None, meta: AttentionMetadata
                ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, normed, meta)
        normed, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(normed), residual


# Hugging Face checkpoint names of the projections we fuse: (fused name, shard index).
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, max_position: int | None = None) -> None:
        super().__init__()
        self.config = config
        positions = max_position or config.max_position_embeddings
        # A plain attribute, not a buffer: it stays float32 whatever dtype the model takes.
        self.cos_sin_cache = build_cos_sin_cache(config.head_dim, config.rope_theta,
                                                 config.rope_scaling, positions)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, self.cos_sin_cache) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def attention_layers(self) -> list[Attention]:
        layers: list[Attention] = []
        for layer in self.layers:
            assert isinstance(layer, LlamaDecoderLayer)
            layers.append(layer.self_attn.attn)
        return layers

    def set_rotary_cache(self, cos_sin_cache: torch.Tensor) -> None:
        """Install a rotary table (float32, on the model's device) in every layer."""
        self.cos_sin_cache = cos_sin_cache
        for layer in self.layers:
            assert isinstance(layer, LlamaDecoderLayer)
            layer.self_attn.cos_sin_cache = cos_sin_cache

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states after the final norm, ``[num_tokens, hidden_size]``."""
        hidden = self.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors in, fusing q/k/v and gate/up as they come."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        sizes = {
            "qkv_proj": [self.config.q_size, self.config.kv_size, self.config.kv_size],
            "gate_up_proj": [self.config.intermediate_size] * 2,
        }
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            name = name.removeprefix("model.")
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            parts = name.split(".")
            fused = _FUSED.get(parts[-2]) if len(parts) >= 2 else None
            if fused is not None:
                target_name = ".".join([*parts[:-2], fused[0], parts[-1]])
                target = params[target_name]
                offset = sum(sizes[fused[0]][: fused[1]])
                size = sizes[fused[0]][fused[1]]
                target.data[offset : offset + size].copy_(tensor)
                loaded.add(f"{target_name}#{fused[1]}")
                continue
            if name not in params:
                raise KeyError(f"checkpoint tensor {name!r} has no place in the model")
            if params[name].shape != tensor.shape:
                raise ValueError(
                    f"{name}: checkpoint shape {tuple(tensor.shape)} != model "
                    f"{tuple(params[name].shape)}"
                )
            params[name].data.copy_(tensor)
            loaded.add(name)
        self._check_complete(params, loaded)

    def _check_complete(self, params: dict[str, nn.Parameter], loaded: set[str]) -> None:
        missing = []
        for name in params:
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            base = name.rsplit(".", 2)
            if len(base) == 3 and base[1] in ("qkv_proj", "gate_up_proj"):
                shards = 3 if base[1] == "qkv_proj" else 2
                if not all(f"{name}#{i}" in loaded for i in range(shards)):
                    missing.append(name)
            elif name not in loaded:
                missing.append(name)
        if missing:
            raise ValueError(f"checkpoint is missing weights: {', '.join(missing[:8])}")
