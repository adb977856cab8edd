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


# Rows quantized per pass: the float32 temporaries of a pass stay a few MiB, whatever the
# matrix (a 128k-token embedding table quantized whole needs two float32 copies of it).
_ROWS_PER_PASS = 2048


def quantize_matrix(weight: torch.Tensor, method: str, group_size: int) -> QuantizedWeight:
    """``weight`` quantized (``int8`` or ``int4``), a pass of ``_ROWS_PER_PASS`` rows at a time:
    both schemes scale each row on its own, so the passes give the whole-matrix result."""
    if method not in ("int8", "int4"):
        raise QuantizationError(f"unknown weight quantization {method!r}")
    if method == "int4" and (weight.shape[1] % group_size or weight.shape[1] % 2):
        raise QuantizationError(
            f"int4 group size {group_size} does not divide the input width "
            f"{weight.shape[1]}; choose a group size that does (32 divides every width "
            "of the supported models)"
        )
    rows = weight.shape[0]
    out: QuantizedWeight | None = None
    for start in range(0, rows, _ROWS_PER_PASS):
        chunk = weight[start : start + _ROWS_PER_PASS].detach()
        part = quantize_int8(chunk) if method == "int8" else quantize_int4(chunk, group_size)
        if rows <= _ROWS_PER_PASS:
            return part
        if out is None:
            out = QuantizedWeight(_rows_like(part.qweight, rows), _rows_like(part.scales, rows),
                                  None if part.mins is None else _rows_like(part.mins, rows),
                                  part.bits, part.group_size, part.in_features)
        stop = start + part.out_features
        out.qweight[start:stop] = part.qweight
        out.scales[start:stop] = part.scales
        if out.mins is not None and part.mins is not None:
            out.mins[start:stop] = part.mins
    assert out is not None
    return out


def _rows_like(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.empty((rows, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)


def quantize_part(model: CausalLM, part: str, method: str, group_size: int = 32) -> None:
    """Quantize one loaded part of ``model`` in place: a decoder layer's projections, the LM
    head, or the embedding table (with tied embeddings, the LM head shares its quantized
    table); norms have nothing to quantize. The float weights go with the modules."""
    if part.startswith("layers."):
        for parent, name, linear in quantized_layers(model.layers[int(part.split(".")[1])]):
            _swap(parent, name, linear, method, group_size)
    elif part == "lm_head" and isinstance(model.lm_head, nn.Linear):
        _swap(model, "lm_head", model.lm_head, method, group_size)
    elif part == "embed_tokens" and isinstance(model.embed_tokens, nn.Embedding):
        dtype = model.embed_tokens.weight.dtype
        lm_head = model.lm_head
        if model.config.tie_word_embeddings and isinstance(lm_head, QuantizedLinear):
            table = lm_head
        else:
            table = QuantizedLinear(quantize_matrix(model.embed_tokens.weight, method,
                                                    group_size))
            if model.config.tie_word_embeddings:
                model.lm_head = table  # type: ignore[assignment]
        model.embed_tokens = QuantizedEmbedding(table, dtype)  # type: ignore[assignment]


def _swap(parent: nn.Module, name: str, linear: nn.Linear, method: str,
          group_size: int) -> None:
    bias = None if linear.bias is None else linear.bias.data
    setattr(parent, name, QuantizedLinear(quantize_matrix(linear.weight, method, group_size),
                                          bias))


def quantized_layers(module: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """Every (parent, attribute, linear) of ``module``'s attention and dense MLP
    projections: what the quantization replaces besides the LM head and embeddings."""
    found = []
    for child_module in module.modules():
        for name in LINEAR_NAMES:
            child = getattr(child_module, name, None)
            if isinstance(child, nn.Linear):
                found.append((child_module, name, child))
    return found


def quantize_model(model: CausalLM, method: str, group_size: int = 32) -> CausalLM:
    """Quantize the whole of ``model`` in place (``method`` is ``int8`` or ``int4``)."""
    for index in range(len(model.layers)):
        quantize_part(model, f"layers.{index}", method, group_size)
    quantize_part(model, "lm_head", method, group_size)
    quantize_part(model, "embed_tokens", method, group_size)
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
