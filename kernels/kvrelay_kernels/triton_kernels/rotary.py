# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""Rotary position embedding, in place, one program per token for its query and key heads.

A token's cos/sin row is loaded once and applied to every head of query and key. Rows may
be strided (query and key as slices of a fused QKV projection); within a row, heads are
contiguous. Only the first ``rot_dim`` features of a head rotate (partial rotary).
Pairing: NeoX style couples feature ``i`` with ``i + rot_dim/2``; GPT-J style couples
``2i`` with ``2i + 1``. Arithmetic is float32, rounded once to the tensor's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Elements (heads x rotation pairs) one loop iteration handles.
_TILE = 2048


@triton.jit
def _rotate_heads(
    x_ptr, num_heads, cos, sin, offs_r, r_mask,
    HEAD: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, IS_NEOX: tl.constexpr,
):
    """Rotate every head of one token's row, BLOCK_H heads at a time."""
    if IS_NEOX:
        first = offs_r
        second = offs_r + HALF
    else:
        first = 2 * offs_r
        second = 2 * offs_r + 1
    for h0 in range(0, num_heads, BLOCK_H):
        heads = h0 + tl.arange(0, BLOCK_H)
        mask = (heads < num_heads)[:, None] & r_mask[None, :]
        base = x_ptr + heads[:, None] * HEAD
        x1 = tl.load(base + first[None, :], mask=mask, other=0.0)
        x2 = tl.load(base + second[None, :], mask=mask, other=0.0)
        x1f = x1.to(tl.float32)
        x2f = x2.to(tl.float32)
        tl.store(base + first[None, :], (x1f * cos - x2f * sin).to(x1.dtype), mask=mask)
        tl.store(base + second[None, :], (x2f * cos + x1f * sin).to(x1.dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
    stride_qt, stride_kt, stride_cs_pos, stride_cs_dim,
    num_q_heads, num_k_heads,
    HEAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, IS_NEOX: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    offs_r = tl.arange(0, HALF_PAD)
    r_mask = offs_r < HALF
    row = cos_sin_ptr + position * stride_cs_pos
    cos = tl.load(row + offs_r * stride_cs_dim, mask=r_mask, other=0.0).to(tl.float32)
    sin = tl.load(row + (offs_r + HALF) * stride_cs_dim, mask=r_mask, other=0.0).to(tl.float32)
    cos = cos[None, :]
    sin = sin[None, :]
    _rotate_heads(q_ptr + token * stride_qt, num_q_heads, cos, sin, offs_r, r_mask,
                  HEAD, HALF, BLOCK_HQ, IS_NEOX)
    _rotate_heads(k_ptr + token * stride_kt, num_k_heads, cos, sin, offs_r, r_mask,
                  HEAD, HALF, BLOCK_HK, IS_NEOX)


def _heads(x: torch.Tensor, head_size: int) -> int:
    return x.shape[1] // head_size if x.dim() == 2 else x.shape[1]


def _heads_per_step(num_heads: int, half_pad: int) -> int:
    return max(1, min(triton.next_power_of_2(num_heads), _TILE // half_pad))


def rotary_embedding_triton(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool,
) -> None:
    """Rotate ``query`` and ``key`` in place (arguments checked by the public wrapper).

    ``query``/``key``: ``[tokens, heads * head_size]`` (rows may be strided) or
    ``[tokens, heads, head_size]``; ``cos_sin_cache``: ``[max_position, rot_dim]``.
    """
    num_tokens = positions.shape[0]
    if num_tokens == 0:
        return
    half = cos_sin_cache.shape[1] // 2
    if half == 0:
        return
    half_pad = triton.next_power_of_2(half)
    num_q_heads, num_k_heads = _heads(query, head_size), _heads(key, head_size)
    _rotary_kernel[(num_tokens,)](
        positions, query, key, cos_sin_cache,
        query.stride(0), key.stride(0), cos_sin_cache.stride(0), cos_sin_cache.stride(1),
        num_q_heads, num_k_heads,
        HEAD=head_size, HALF=half, HALF_PAD=half_pad,
        BLOCK_HQ=_heads_per_step(num_q_heads, half_pad),
        BLOCK_HK=_heads_per_step(num_k_heads, half_pad),
        IS_NEOX=is_neox, num_warps=4,
    )
