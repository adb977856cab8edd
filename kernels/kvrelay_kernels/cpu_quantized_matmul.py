"""Weight-only quantized matmul on CPU: three C++ kernels, chosen by the number of rows.

Batch-1 decode streams every weight byte once per token, so its speed is the bytes read
and the work done per byte. Few rows take ``cpu_kernels/quantized_linear.cpp``: the
activations are quantized to int16 per block of 32 and each block is an integer dot
product with the packed weights (AVX-512 VNNI or AVX2), never writing a float weight.
Its work grows with every row, while the weights are read once whatever the batch; so
from a few rows on the product is compute-bound and a GEMM wins. ``cpu_kernels/
int16_gemm.cpp`` is that GEMM on int16 (twice a float GEMM's multiply-adds per
instruction), with the weights repacked at first use; where its level has no integer GEMM
or the groups are not whole blocks of 32 (Q6_K), ``cpu_kernels/dequantized_linear.cpp``
dequantizes a tile of output channels into cache and multiplies the batch by it with the
float GEMM. ``INTEGER_DOT_MAX_ROWS`` holds the crossing per weight width, measured by
``benchmarks/quant_matmul_rows.py`` with weights that do not stay in cache.

All three are part of the C++ extension built on first use (``cpu_kernels/build.py``); where
it cannot be built (no compiler), or for a layout they refuse (groups that are not
whole 32-input blocks, int4 groups that straddle the two halves of a row), the caller
takes the reference path. int8 weights may have minimums (GGUF's Q5_1, Q5_K) and groups of
16 (Q6_K: the integer kernel only without minimums; the tiles take any group).
"""

from __future__ import annotations

import functools
import os
import weakref

import torch

from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
from kvrelay_kernels.quantized_weight import QuantizedWeight

BLOCK = 32  # the integer kernel's activation block
MAX_BLOCKS = 1024  # its per-row scratch: K up to 32768
# Rows up to which the integer kernel runs, by weight bits; more rows take the tiles.
# int8 (per channel): the integer kernel wins up to 24 rows (tiles from 32); int4 in
# groups of 32 (widened once for up to four rows per pass): up to 12, the tiles from 16
# (benchmarks/quant_matmul_rows.py, AVX2).
INTEGER_DOT_MAX_ROWS = {8: 24, 4: 12}


def integer_dot_serves(rows: int, weight: QuantizedWeight) -> bool:
    """Whether the integer kernel takes a product of ``rows`` rows with ``weight``."""
    k, g = weight.in_features, weight.group_size
    # groups of 16 (GGUF's Q6_K): symmetric int8 only, two scales per activation block
    halves = g == BLOCK // 2 and weight.bits == 8 and weight.mins is None
    return (rows <= INTEGER_DOT_MAX_ROWS[weight.bits] and (g % BLOCK == 0 or halves)
            and k % BLOCK == 0 and k // BLOCK <= MAX_BLOCKS
            and (weight.bits == 8 or (k // 2) % BLOCK == 0))


def dequantized_tiles_serve(weight: QuantizedWeight) -> bool:
    """Whether the dequantize-tiles kernel takes ``weight`` (int4: groups within row halves)."""
    return weight.bits == 8 or (weight.in_features // 2) % weight.group_size == 0


# The integer GEMM's packed copy of each weight it served, keyed by the qweight tensor's id
# and dropped with that tensor; a hit must hold the very same qweight, scales and mins.
Pack = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
_GEMM_PACKS: dict[int, tuple[list[weakref.ref[torch.Tensor]], Pack]] = {}


@functools.cache
def gemm_lanes() -> int:
    """Output channels per register of the integer GEMM at this process's level (0: none,
    or no C++ extension); constant for the process, so asked once."""
    return int(torch.ops.kvrelay_cpu.int16_gemm_lanes()) if load_cpu_kernels() else 0


def int16_gemm_serves(weight: QuantizedWeight) -> bool:
    """Whether the integer GEMM takes ``weight`` (groups of whole 32-input blocks) here."""
    k, g = weight.in_features, weight.group_size
    return (os.environ.get("KVRELAY_CPU_INT16_GEMM", "1") != "0" and gemm_lanes() > 0
            and g % BLOCK == 0 and k % BLOCK == 0
            and (weight.bits == 8 or (k // 2) % BLOCK == 0))


def int16_gemm_pack(weight: QuantizedWeight) -> Pack:
    """The weight repacked for the integer GEMM, made at its first use and kept with it."""
    tensors = [t for t in (weight.qweight, weight.scales, weight.mins) if t is not None]
    key = id(weight.qweight)
    hit = _GEMM_PACKS.get(key)
    if hit is not None and len(hit[0]) == len(tensors) and all(
            ref() is t for ref, t in zip(hit[0], tensors, strict=True)):
        return hit[1]
    values, scales, mins = torch.ops.kvrelay_cpu.pack_int16_gemm(
        weight.qweight, weight.scales.contiguous(),
        None if weight.mins is None else weight.mins.contiguous(), weight.bits,
        weight.group_size, weight.in_features)
    pack = (values, scales, mins)
    refs = [weakref.ref(weight.qweight, lambda _: _GEMM_PACKS.pop(key, None)),
            *(weakref.ref(t) for t in tensors[1:])]
    _GEMM_PACKS[key] = (refs, pack)
    return pack


def quantized_matmul_cpu(x: torch.Tensor, weight: QuantizedWeight,
                         bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x @ dequantize(weight).T + bias`` (2-D ``x``), or None where no kernel serves it."""
    if not load_cpu_kernels():
        return None
    if integer_dot_serves(x.shape[0], weight):
        op = torch.ops.kvrelay_cpu.quantized_linear
    elif int16_gemm_serves(weight):
        values, scales, mins = int16_gemm_pack(weight)
        out = torch.ops.kvrelay_cpu.int16_gemm(
            x.float().contiguous(), values, scales, mins, weight.out_features,
            None if bias is None else bias.float().contiguous())
        return out.to(x.dtype)
    elif dequantized_tiles_serve(weight):
        op = torch.ops.kvrelay_cpu.dequantized_linear
    else:
        return None
    out = op(x.float().contiguous(), weight.qweight, weight.scales.contiguous(),
             None if weight.mins is None else weight.mins.contiguous(), weight.bits,
             weight.group_size, None if bias is None else bias.float().contiguous())
    return out.to(x.dtype)


def cpu_kernel_names() -> str:
    """What the quantized products run on this machine, for the worker's ready line."""
    if not load_cpu_kernels():
        return "reference (no C++ extension)"
    isa = torch.ops.kvrelay_cpu.quantized_linear_isa()
    many = "int16 GEMM" if gemm_lanes() > 0 else "dequantized tiles + GEMM"
    return f"integer dot ({isa}) for few rows, {many} for more"
