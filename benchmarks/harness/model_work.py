"""Work a decoder model asks of a CPU, counted from its config (``engine.model.config``).

FLOPs are 2 per multiply-add. Per token, the decoder's matmuls multiply every weight of
q/k/v, o, gate/up and down once (for MoE layers the router and ``top_k`` experts); the LM
head runs only on rows that sample; attention is ``Q K^T`` and ``P V`` over the positions
a token sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def matmul_params_per_token(config: Any) -> int:
    """Weights one token multiplies in the decoder layers (LM head excluded)."""
    hidden = config.hidden_size
    qkv = hidden * (config.q_size + 2 * config.kv_size)
    out = config.q_size * hidden
    total = 0
    for layer in range(config.num_hidden_layers):
        total += qkv + out
        if config.is_moe_layer(layer):
            expert = 3 * hidden * config.moe_intermediate_size
            total += hidden * config.num_experts + config.num_experts_per_tok * expert
        else:
            total += 3 * hidden * config.intermediate_size
    return total


def attention_flops(config: Any, context: int) -> int:
    """``Q K^T`` and ``P V`` of one query token over ``context`` positions, all layers."""
    heads, dim = config.num_attention_heads, config.head_dim
    return 4 * heads * dim * context * config.num_hidden_layers


def lm_head_flops(config: Any) -> int:
    return 2 * config.vocab_size * config.hidden_size


def prefill_flops(config: Any, prompt_lens: Sequence[int]) -> int:
    """Every prompt token through the decoder (causal attention), one LM-head row each."""
    per_token = 2 * matmul_params_per_token(config)
    total = 0
    for n in prompt_lens:
        total += n * per_token + lm_head_flops(config)
        total += attention_flops(config, n * (n + 1) // 2)  # position p sees p + 1 tokens
    return total


def decode_step_flops(config: Any, contexts: Sequence[int]) -> int:
    """One decode step: a token per sequence, each attending to its whole context."""
    per_seq = 2 * matmul_params_per_token(config) + lm_head_flops(config)
    return sum(per_seq + attention_flops(config, c) for c in contexts)
