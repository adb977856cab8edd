# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""Scatter the new tokens' K/V rows into their cache slots.

One program per token copies all of its KV heads (a few KiB) in one tile; a token whose
slot is -1 (padding, e.g. in a CUDA-graph batch) exits without touching the cache.

For a quantized cache (``QUANT``: 1 int8, 2 float8 e4m3) each (token, head) row is
quantized as ``kvrelay_kernels.kv_quant`` describes, with the same integer arithmetic on
the float bits for the power-of-two scale, so the bytes equal the reference's: the values
go to the row's aligned place in its block, the scale to the block's tail.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvrelay_kernels import kv_quant

# The format's constants, as Triton wants globals: constexprs.
_INT8_TOP = tl.constexpr(kv_quant.INT8_TOP)
_INT8_TOP_EXP = tl.constexpr(kv_quant.INT8_TOP_EXP)
_INT8_TOP_FRAC = tl.constexpr(kv_quant.INT8_TOP_FRAC)
_FP8_TOP = tl.constexpr(kv_quant.FP8_TOP)
_FP8_TOP_EXP = tl.constexpr(kv_quant.FP8_TOP_EXP)
_FP8_TOP_FRAC = tl.constexpr(kv_quant.FP8_TOP_FRAC)
_MIN_EXPONENT = tl.constexpr(kv_quant.MIN_EXPONENT)
_MAX_EXPONENT = tl.constexpr(kv_quant.MAX_EXPONENT)

# Elements one program moves per tile; more heads than fit are spread over grid axis 1.
_MAX_TILE = 8192


@triton.jit
def _to_e4m3_bits(x):
    """float8 e4m3 bits (as int32) of float32 ``x`` with ``|x| <= 448``, rounded to nearest
    even, from integer operations on the float bits (the interpreter's own float8 cast
    rounds differently from the GPU's and torch's; these bits equal torch's everywhere)."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    magnitude = bits & 0x7FFFFFFF
    # Normal e4m3 (|x| >= 2**-6): keep 3 of the 23 mantissa bits, ties to even, and move
    # the exponent bias from 127 to 7 (a carry out of the mantissa bumps the exponent).
    kept = (magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20
    normal = kept - (120 << 3)
    # Subnormal e4m3 (|x| < 2**-6): multiples of 2**-9, i.e. round(|x| * 512), ties to even
    # (the code for 8 * 2**-9 = 2**-6 is 8, the smallest normal: the two ranges join up).
    t = tl.abs(x) * 512.0
    low = tl.floor(t)
    frac = t - low
    odd = (low.to(tl.int32) & 1) == 1
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    subnormal = low.to(tl.int32) + up.to(tl.int32)
    return tl.where(magnitude < 0x3C800000, subnormal, normal) | sign


@triton.jit
def _quantize_rows(x, QUANT: tl.constexpr):
    """``(values, exponent)`` of rows ``x`` ``[heads, HEAD_PAD]`` (float32, padding 0)."""
    bits = tl.max(tl.abs(x), 1).to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    if QUANT == 1:
        exponent = exponent - _INT8_TOP_EXP + ((bits & 0x7FFFFF) > _INT8_TOP_FRAC).to(tl.int32)
    else:
        exponent = exponent - _FP8_TOP_EXP + ((bits & 0x7FFFFF) > _FP8_TOP_FRAC).to(tl.int32)
    exponent = tl.minimum(tl.maximum(exponent, _MIN_EXPONENT), _MAX_EXPONENT)
    inverse = ((127 - exponent) << 23).to(tl.float32, bitcast=True)
    scaled = x * inverse[:, None]
    if QUANT == 1:
        rounded = tl.floor(scaled + 0.5)  # round half up, as the reference
        values = tl.minimum(tl.maximum(rounded, -_INT8_TOP), _INT8_TOP).to(tl.int8)
    else:
        clamped = tl.minimum(tl.maximum(scaled, -_FP8_TOP), _FP8_TOP)
        values = _to_e4m3_bits(clamped).to(tl.int8)
    return values, exponent.to(tl.int8)


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    num_kv_heads,
    HEAD: tl.constexpr, HEAD_PAD: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr,
    ROW: tl.constexpr, QUANT: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    heads = tl.program_id(1) * HEADS_PER_PROGRAM + tl.arange(0, HEADS_PER_PROGRAM)
    offs_d = tl.arange(0, HEAD_PAD)
    mask = (heads < num_kv_heads)[:, None] & (offs_d < HEAD)[None, :]
    row = token.to(tl.int64)
    key = tl.load(key_ptr + row * stride_kt + heads[:, None] * stride_kh + offs_d[None, :],
                  mask=mask)
    value = tl.load(value_ptr + row * stride_vt + heads[:, None] * stride_vh + offs_d[None, :],
                    mask=mask)
    if QUANT:
        # A block is BLOCK_SIZE * num_kv_heads rows of HEAD values, then one scale byte per
        # row in the same order (kv_quant): the scale index is the value offset / HEAD.
        block = slot // BLOCK_SIZE
        block_start = block * (BLOCK_SIZE * num_kv_heads * ROW)
        row_index = (slot - block * BLOCK_SIZE) * num_kv_heads + heads
        cache_offset = block_start + row_index[:, None] * HEAD + offs_d[None, :]
        scale_offset = block_start + BLOCK_SIZE * num_kv_heads * HEAD + row_index
        key_q, key_exp = _quantize_rows(tl.where(mask, key.to(tl.float32), 0.0), QUANT)
        value_q, value_exp = _quantize_rows(tl.where(mask, value.to(tl.float32), 0.0), QUANT)
        head_mask = heads < num_kv_heads
        tl.store(key_cache_ptr + cache_offset, key_q, mask=mask)
        tl.store(value_cache_ptr + cache_offset, value_q, mask=mask)
        tl.store(key_cache_ptr + scale_offset, key_exp, mask=head_mask)
        tl.store(value_cache_ptr + scale_offset, value_exp, mask=head_mask)
    else:
        # Caches are contiguous: a slot is num_kv_heads rows of ROW elements.
        row_offset = slot * (num_kv_heads * ROW) + heads * ROW
        cache_offset = row_offset[:, None] + offs_d[None, :]
        tl.store(key_cache_ptr + cache_offset, key, mask=mask)
        tl.store(value_cache_ptr + cache_offset, value, mask=mask)


def store_kv_cache_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Copy ``key[i]``/``value[i]`` (``[tokens, kv_heads, head]``) to slot ``slot_mapping[i]``.

    Arguments are already checked by ``kvrelay_kernels.store_kv_cache``; slot -1 skips.
    Quantized caches are passed to the kernel as int8 bytes.
    """
    num_tokens, num_kv_heads, head_size = key.shape
    if num_tokens == 0:
        return
    head_pad = triton.next_power_of_2(head_size)
    heads_per_program = min(triton.next_power_of_2(num_kv_heads), max(1, _MAX_TILE // head_pad))
    grid = (num_tokens, triton.cdiv(num_kv_heads, heads_per_program))
    quant = quant_code(key_cache.dtype)
    if quant:
        key_cache, value_cache = key_cache.view(torch.int8), value_cache.view(torch.int8)
    _store_kv_kernel[grid](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        num_kv_heads,
        HEAD=head_size, HEAD_PAD=head_pad, HEADS_PER_PROGRAM=heads_per_program,
        ROW=key_cache.shape[3], QUANT=quant, BLOCK_SIZE=key_cache.shape[1], num_warps=4,
    )


def quant_code(cache_dtype: torch.dtype) -> int:
    """The kernels' ``QUANT`` constexpr for a cache dtype: 0 float, 1 int8, 2 float8 e4m3."""
    if cache_dtype == torch.int8:
        return 1
    if cache_dtype == torch.float8_e4m3fn:
        return 2
    return 0
