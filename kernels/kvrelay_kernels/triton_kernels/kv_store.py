# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""Scatter the new tokens' K/V rows into their cache slots.

One program per token copies all of its KV heads (a few KiB) in one tile; a token whose
slot is -1 (padding, e.g. in a CUDA-graph batch) exits without touching the cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Elements one program moves per tile; more heads than fit are spread over grid axis 1.
_MAX_TILE = 8192


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    num_kv_heads,
    HEAD: tl.constexpr, HEAD_PAD: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr,
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
    # Caches are contiguous: a slot is num_kv_heads * HEAD elements.
    cache_offset = slot * (num_kv_heads * HEAD) + heads[:, None] * HEAD + offs_d[None, :]
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
    """
    num_tokens, num_kv_heads, head_size = key.shape
    if num_tokens == 0:
        return
    head_pad = triton.next_power_of_2(head_size)
    heads_per_program = min(triton.next_power_of_2(num_kv_heads), max(1, _MAX_TILE // head_pad))
    grid = (num_tokens, triton.cdiv(num_kv_heads, heads_per_program))
    _store_kv_kernel[grid](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        num_kv_heads,
        HEAD=head_size, HEAD_PAD=head_pad, HEADS_PER_PROGRAM=heads_per_program,
        num_warps=4,
    )
