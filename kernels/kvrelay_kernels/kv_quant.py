"""The quantized KV cache's block layout, and its plain-PyTorch quantizer and dequantizer.

A quantized cache tensor keeps the float cache's shape except the last dimension,
``[num_blocks, block_size, num_kv_heads, head_size + 1]``: the same bytes per block as
rows of ``head_size`` one-byte values plus ONE scale byte, but not laid out as such rows.
Inside each block (``B = block_size``, ``H = num_kv_heads``, ``D = head_size``):

- bytes ``[0, B*H*D)``: the values, row by row (row ``(slot, head)`` at
  ``(slot * H + head) * D``), so every row starts at a multiple of ``D`` bytes: 16-byte
  aligned for every supported head size (64, 80, 96, 128, 256), and the kernels load
  whole vectors instead of byte by byte;
- bytes ``[B*H*D, B*H*(D + 1))``: the block's scales, one byte per row in the same order
  (row ``(slot, head)``'s at ``B*H*D + slot * H + head``, i.e. the tail's start plus the
  row's value offset divided by ``D``).

Blocks start at multiples of ``B*H*(D + 1)`` bytes: 16-byte aligned whenever ``B*H`` is a
multiple of 16 (every block size from 16 up; block size 8 with an even head count).

Each byte of scale holds a power-of-two exponent ``e`` (scale ``2**e``, an "e8m0"-style
scale stored as a signed int8). Keys and values are quantized symmetrically per token and
head: ``x ~= value * 2**e``.

Why this layout:

- Bytes: with head size 64, a row costs 65 bytes against 256 in float32, 3.94x the blocks
  at the same memory (a float16 scale would give 256 / 66 = 3.88x; padding each row to 80
  bytes for alignment would give 3.2x).
- The scales travel inside the block: copy-on-write, swap out/in and prefix caching copy
  or keep whole blocks of one tensor per layer, so they carry the scales with no change.
- A power of two is exact: ``x * 2**-e`` and ``value * 2**e`` round nothing, so the only
  error is the rounding to the value grid, and the scale is built from float bits with
  integer arithmetic that the reference and the Triton kernels perform identically.
  The price: the grid step is at most 2x coarser than an exact ``amax / 127`` scale
  would give (the row's largest value lands in [64, 127] instead of at 127).

Formats: ``int8`` (values in [-127, 127]) and ``float8_e4m3fn`` (values up to 448, whose
3-bit mantissa sets the precision; the scale only keeps the row in range).

``quantize_rows``/``dequantize_rows`` work on single rows packed as ``head_size`` values
followed by their scale byte (a transient form, never the cache's); ``quantize_blocks``,
``dequantize_blocks``, ``block_values`` and ``block_exponents`` on the cache's blocks.
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
    """Whether a cache of this dtype holds quantized blocks (values, then a scale tail)."""
    return dtype in QUANTIZED_KV_DTYPES


def kv_row_size(head_size: int, cache_dtype: torch.dtype) -> int:
    """The cache tensor's last dimension: elements per (token, KV head) of ``cache_dtype``
    (for a quantized cache its bytes, values plus scale, though not stored together)."""
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


def quantize_values(rows: torch.Tensor,
                    cache_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, exponents)`` of float rows ``[..., head_size]``: ``cache_dtype`` values
    of the same shape and one int8 exponent per row."""
    exponent = row_exponents(rows, cache_dtype)
    scaled = rows.float() * power_of_two(-exponent)[..., None]
    if cache_dtype == torch.int8:
        # floor(x + 0.5): round half up, the same operation the Triton store performs.
        values = torch.floor(scaled + 0.5).clamp(-INT8_TOP, INT8_TOP).to(torch.int8)
    else:
        values = scaled.clamp(-FP8_TOP, FP8_TOP).to(cache_dtype)
    return values, exponent.to(torch.int8)


def dequantize_values(values: torch.Tensor, exponents: torch.Tensor,
                      dtype: torch.dtype) -> torch.Tensor:
    """Float rows ``[..., head_size]`` of ``dtype`` from values and their int8 exponents."""
    scale = power_of_two(exponents.to(torch.int32))[..., None]
    # One cast into a fresh float32 tensor, then an in-place multiply (faster on CPU than
    # a mixed int8 * float32 multiply, and float8 has no mixed kernels at all).
    return values.float().mul_(scale).to(dtype)


def quantize_rows(rows: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """Quantize ``[..., head_size]`` float rows into packed ``[..., head_size + 1]`` rows
    (values, then the scale byte)."""
    values, exponent = quantize_values(rows, cache_dtype)
    packed = torch.empty((*rows.shape[:-1], rows.shape[-1] + 1), dtype=cache_dtype,
                         device=rows.device)
    packed.view(torch.int8)[..., :-1] = values.view(torch.int8)
    packed.view(torch.int8)[..., -1] = exponent
    return packed


def dequantize_rows(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float rows ``[..., head_size]`` of ``dtype`` back from packed ``[..., head_size + 1]``."""
    return dequantize_values(packed[..., :-1], packed.view(torch.int8)[..., -1], dtype)


def _value_bytes(cache: torch.Tensor) -> int:
    """Bytes of values in one block (where its scale tail starts)."""
    _, block_size, num_kv_heads, row = cache.shape
    return block_size * num_kv_heads * (row - 1)


def block_values(cache: torch.Tensor) -> torch.Tensor:
    """The values of a contiguous quantized cache ``[num_blocks, B, H, D + 1]`` as a view
    ``[num_blocks, B, H, D]`` of its dtype (each block's first ``B*H*D`` bytes)."""
    num_blocks, block_size, num_kv_heads, row = cache.shape
    flat = cache.view(num_blocks, -1)[:, : _value_bytes(cache)]
    return flat.view(num_blocks, block_size, num_kv_heads, row - 1)


def block_exponents(cache: torch.Tensor) -> torch.Tensor:
    """The scale exponents of a contiguous quantized cache as an int8 view
    ``[num_blocks, B, H]`` (each block's tail)."""
    num_blocks, block_size, num_kv_heads, _ = cache.shape
    flat = cache.view(torch.int8).view(num_blocks, -1)[:, _value_bytes(cache):]
    return flat.view(num_blocks, block_size, num_kv_heads)


def quantize_blocks(blocks: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """A quantized cache ``[num_blocks, B, H, D + 1]`` from float blocks ``[..., D]``."""
    values, exponents = quantize_values(blocks, cache_dtype)
    cache = torch.empty((*blocks.shape[:-1], blocks.shape[-1] + 1), dtype=cache_dtype,
                        device=blocks.device)
    block_values(cache).view(torch.int8).copy_(values.view(torch.int8))
    block_exponents(cache).copy_(exponents)
    return cache


def dequantize_blocks(cache: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float blocks ``[num_blocks, B, H, D]`` of ``dtype`` from a quantized cache."""
    return dequantize_values(block_values(cache), block_exponents(cache), dtype)


def value_row_strides(cache: torch.Tensor) -> tuple[int, int, int]:
    """Elements between consecutive blocks, slots and KV heads of the value rows: the
    tensor's strides for a float cache; for a quantized one, rows of ``D`` packed ahead of
    the block's scale tail."""
    if not is_quantized_kv(cache.dtype):
        return cache.stride(0), cache.stride(1), cache.stride(2)
    _, block_size, num_kv_heads, row = cache.shape
    return block_size * num_kv_heads * row, num_kv_heads * (row - 1), row - 1
