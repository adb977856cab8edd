"""Repack a compressed-tensors FP8 layer onto ``kvrelay_kernels.fp8_weight``'s layout.

compressed-tensors' ``float-quantized`` compressor stores, per linear layer, ``weight``
float8_e4m3fn ``[N, K]`` and ``weight_scale`` float32 with ``w = float(q) * scale``:
``[N, 1]`` per channel, ``[1]`` (or a scalar) per tensor, ``[ceil(N / r), ceil(K / c)]``
per ``r x c`` block (partial blocks at the edges); a static activation scheme adds
``input_scale`` ``[1]``. The FP8 bytes are kept as they are; only the scales change
shape: a tensor's scale is repeated over its channels and a block's over its rows, so
every layer becomes ``[N, ceil(K / group)]`` (``group`` = K, or the block's width). That
is what keeps a fused q/k/v or gate/up exact when its shards were quantized with
different per-tensor scales: after the spread each channel carries its own.

A fused product quantizes its input once, so its shards' static activation scales
become one: the largest (as vLLM does), so that no shard's activations clip. The float
paths (CPU, Triton) never use it.
"""

from __future__ import annotations

import math

import torch

from kvrelay_kernels.fp8_weight import FP8_DTYPE, Fp8Weight
from kvrelay_worker.loading.prequantized_config import Fp8Scheme
from kvrelay_worker.models.errors import UnsupportedModelError


def repack_fp8_layer(parts: dict[str, torch.Tensor], scheme: Fp8Scheme,
                     name: str) -> Fp8Weight:
    """One layer's ``weight``, ``weight_scale`` (and ``input_scale``) as an ``Fp8Weight``."""
    weight = parts.get("weight")
    scale = parts.get("weight_scale")
    if weight is None or scale is None or weight.dtype != FP8_DTYPE or weight.dim() != 2:
        raise UnsupportedModelError(f"{name}: an FP8 layer needs a float8_e4m3fn weight and "
                                    "its weight_scale")
    n, k = weight.shape
    scale = scale.float()
    if scheme.block is not None:
        rows, group = scheme.block
        if tuple(scale.shape) != (math.ceil(n / rows), math.ceil(k / group)):
            raise UnsupportedModelError(f"{name}: weight_scale of shape {tuple(scale.shape)} "
                                        f"for a {n}x{k} weight in {rows}x{group} blocks")
        scales = scale.repeat_interleave(rows, dim=0)[:n]
    elif scheme.strategy == "tensor":
        if scale.numel() != 1:
            raise UnsupportedModelError(f"{name}: {scale.numel()} scales for a per-tensor "
                                        "scheme")
        group, scales = k, scale.reshape(1, 1).expand(n, 1)
    else:
        if scale.numel() != n:
            raise UnsupportedModelError(f"{name}: weight_scale of shape {tuple(scale.shape)} "
                                        f"for {n} channels")
        group, scales = k, scale.reshape(n, 1)
    input_scale = None
    if scheme.activations == "static":
        stored = parts.get("input_scale")
        if stored is None or stored.numel() != 1:
            raise UnsupportedModelError(f"{name}: a static activation scheme without one "
                                        "input_scale")
        input_scale = stored.float().reshape(())
    return Fp8Weight(weight.contiguous(), scales.contiguous(), group, scheme.activations,
                     input_scale)


def concat_fp8(parts: list[Fp8Weight], path: str) -> Fp8Weight:
    """The shards of one fused layer (q|k|v, gate|up), stacked along the outputs."""
    first = parts[0]
    for p in parts[1:]:
        if (p.group_size, p.in_features, p.activations) != (
                first.group_size, first.in_features, first.activations):
            raise UnsupportedModelError(f"{path}: its shards are quantized differently")
    if len(parts) == 1:
        return first
    scales = [p.input_scale for p in parts if p.input_scale is not None]
    input_scale = torch.stack(scales).amax() if scales else None
    return Fp8Weight(torch.cat([p.weight for p in parts]).contiguous(),
                     torch.cat([p.scales for p in parts]).contiguous(), first.group_size,
                     first.activations, input_scale)
