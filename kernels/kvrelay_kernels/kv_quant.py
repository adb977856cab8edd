"""The quantized KV cache's row format, and its plain-PyTorch quantizer and dequantizer.

A quantized cache keeps the float cache's shape except the last dimension: each
(token, KV head) row is ``head_size`` one-byte values followed by ONE byte holding the
row's scale as a power-of-two exponent ``e`` (scale ``2**e``, an "e8m0"-style scale
stored as a signed int8). Keys and values are quantized symmetrically per token and head:
``x ~= value * 2**e``.

Why this layout:

- Bytes: with head size 64, a row is 65 bytes against 256 in float32, 3.94x the blocks
  at the same memory (a float16 scale would give 256 / 66 = 3.88x).
- The scale travels inside the block: copy-on-write, swap out/in and prefix caching copy
  or keep whole blocks of one tensor per layer, so they carry the scales with no change.
- A power of two is exact: ``x * 2**-e`` and ``value * 2**e`` round nothing, so the only
  error is the rounding to the value grid, and the scale is built from float bits with
  integer arithmetic that the reference and the Triton kernels perform identically.
  The price: the grid step is at most 2x coarser than an exact ``amax / 127`` scale
  would give (the row's largest value lands in [64, 127] instead of at 127).

Formats: ``int8`` (values in [-127, 127]) and ``float8_e4m3fn`` (values up to 448, whose
3-bit mantissa sets the precision; the scale only keeps the row in range).
"""

from __future__ import annotations

import torch

QUANTIZED_KV_DTYPES = (torch.int8, torch.float8_e4m3fn)

# Exponent bounds: 2**e and 2**-e must both be normal float32 numbers.
MIN_EXPONENT = -126
MAX_EXPONENT = 126

# Per format: the largest value code (the grid's top), written as ``2**K * (1 + F / 2**23)``
# so the exponent of ``amax / top`` follows from amax's float bits alone. The row's
# exponent is the smallest ``e`` with ``amax <= top * 2**e``: with ``amax = 2**E * (1 + f /
# 2**23)`` that is ``E - K`` when ``f <= F``, else ``E - K + 1``.
INT8_TOP = 127.0  # 2**6 * 1.984375
INT8_TOP_EXP, INT8_TOP_FRAC = 6, 0x7E0000
FP8_TOP = 448.0  # 2**8 * 1.75
FP8_TOP_EXP, FP8_TOP_FRAC = 8, 0x600000


def is_quantized_kv(dtype: torch.dtype) -> bool:
    """Whether a cache of this dtype holds quantized rows (values plus a scale byte)."""
    return dtype in QUANTIZED_KV_DTYPES


def kv_row_size(head_size: int, cache_dtype: torch.dtype) -> int:
    """Elements in one (token, KV head) row of a cache of ``cache_dtype``."""
    return head_size + 1 if is_quantized_kv(cache_dtype) else head_size


def _top(cache_dtype: torch.dtype) -> tuple[int, int]:
    if cache_dtype == torch.int8:
        return INT8_TOP_EXP, INT8_TOP_FRAC
    return FP8_TOP_EXP, FP8_TOP_FRAC


def row_exponents(rows: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """The int32 exponent of each row of ``rows`` (``[..., head_size]``) for this format."""
    top_exp, top_frac = _top(cache_dtype)
    amax = rows.float().abs().amax(dim=-1)
    bits = amax.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127 - top_exp + ((bits & 0x7FFFFF) > top_frac).int()
    return exponent.clamp(MIN_EXPONENT, MAX_EXPONENT)


def power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """``2.0 ** exponent`` in float32, exactly, from the bits (exponent in [-126, 127])."""
    return ((exponent.to(torch.int32) + 127) << 23).view(torch.float32)


def quantize_rows(rows: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """Quantize ``[..., head_size]`` float rows into ``[..., head_size + 1]`` cache rows."""
    exponent = row_exponents(rows, cache_dtype)
    scaled = rows.float() * power_of_two(-exponent)[..., None]
    packed = torch.empty((*rows.shape[:-1], rows.shape[-1] + 1), dtype=cache_dtype,
                         device=rows.device)
    if cache_dtype == torch.int8:
        # floor(x + 0.5): round half up, the same operation the Triton store performs.
        packed[..., :-1] = torch.floor(scaled + 0.5).clamp(-INT8_TOP, INT8_TOP).to(torch.int8)
    else:
        packed[..., :-1] = scaled.clamp(-FP8_TOP, FP8_TOP).to(cache_dtype)
    packed.view(torch.int8)[..., -1] = exponent.to(torch.int8)
    return packed


def dequantize_rows(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float rows ``[..., head_size]`` of ``dtype`` back from quantized ``[..., head_size + 1]``."""
    scale = power_of_two(packed.view(torch.int8)[..., -1].to(torch.int32))[..., None]
    # One cast into a fresh float32 tensor, then an in-place multiply (faster on CPU than
    # a mixed int8 * float32 multiply, and float8 has no mixed kernels at all).
    return packed[..., :-1].float().mul_(scale).to(dtype)
