"""Swap a float model's linear layers (and LM head, and embeddings) for quantized ones.

``int8``: symmetric, one scale per output channel. ``int4``: groups of ``group_size``
inputs with a scale and a minimum each (default 32, GGUF's block: SmolLM2's 576-wide
projections divide by 32 and 64 but not 128, and 32 keeps the error lowest).
The LM head is quantized too: with SmolLM2's tied embeddings it is a fifth of the weight
bytes, which batch-1 decode reads every token. Expert weights of mixture-of-experts
layers stay float (their batched expert matmul has no quantized kernel yet).
"""

from __future__ import annotations

import torch
from torch import nn

from kvrelay_kernels.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8
from kvrelay_worker.models.decoder import CausalLM
from kvrelay_worker.models.quantized_linear import QuantizedEmbedding, QuantizedLinear

# Projections of the decoder layers that hold a matrix (attention and dense MLP).
LINEAR_NAMES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class QuantizationError(ValueError):
    """A quantization setting the model cannot take."""


def quantize_matrix(weight: torch.Tensor, method: str, group_size: int) -> QuantizedWeight:
    if method == "int8":
        return quantize_int8(weight.detach())
    if method == "int4":
        if weight.shape[1] % group_size or weight.shape[1] % 2:
            raise QuantizationError(
                f"int4 group size {group_size} does not divide the input width "
                f"{weight.shape[1]}; choose a group size that does (32 divides every width "
                "of the supported models)"
            )
        return quantize_int4(weight.detach(), group_size)
    raise QuantizationError(f"unknown weight quantization {method!r}")


def quantized_layers(model: CausalLM) -> list[tuple[nn.Module, str, nn.Linear]]:
    """Every (parent, attribute, linear) the quantization replaces, LM head last."""
    found = []
    for module in model.modules():
        for name in LINEAR_NAMES:
            child = getattr(module, name, None)
            if isinstance(child, nn.Linear):
                found.append((module, name, child))
    found.append((model, "lm_head", model.lm_head))
    return found


def quantize_model(model: CausalLM, method: str, group_size: int = 32) -> CausalLM:
    """Quantize ``model`` in place (``method`` is ``int8`` or ``int4``) and return it."""
    dtype = model.embed_tokens.weight.dtype
    for parent, name, linear in quantized_layers(model):
        if not isinstance(linear, nn.Linear):
            continue
        bias = None if linear.bias is None else linear.bias.data
        setattr(parent, name, QuantizedLinear(quantize_matrix(linear.weight, method,
                                                              group_size), bias))
    embed = model.embed_tokens
    if isinstance(embed, nn.Embedding):
        lm_head = model.lm_head
        if model.config.tie_word_embeddings and isinstance(lm_head, QuantizedLinear):
            table = lm_head
        else:
            table = QuantizedLinear(quantize_matrix(embed.weight, method, group_size))
        model.embed_tokens = QuantizedEmbedding(table, dtype)  # type: ignore[assignment]
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes of weights resident: parameters and quantized buffers, each tensor once."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        total += tensor.numel() * tensor.element_size()
    return total
