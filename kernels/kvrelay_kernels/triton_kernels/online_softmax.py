# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""One step of the attention loop both kernels share: a context tile through online softmax.

The decode and the prefill kernel walk a sequence's context ``TILE_N`` tokens at a time:
gather the tile's K and V through the block table, score the program's query rows
against K, and fold the scores into the running max, sum and (unnormalised) output. Only
which keys a row may see differs: every key before ``kv_end`` for decode, and causally
(``pos <= q_pos``) for prefill, chosen by ``CAUSAL``. Scores are in the log2 domain.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kvrelay_kernels.triton_kernels.dot import mma


@triton.jit
def attend_tile(
    q, acc, row_max, row_sum, q_pos,
    k_cache_ptr, v_cache_ptr, table, head_offset,
    tile_start, kv_end, offs_n, offs_d, d_mask,
    stride_cache_block, stride_cache_slot, qk_scale_log2,
    BLOCK_SIZE: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_WIDEN: tl.constexpr,
):
    """Fold context tokens ``tile_start + offs_n`` into ``(acc, row_max, row_sum)``."""
    pos = tile_start + offs_n
    n_mask = pos < kv_end
    block = tl.load(table + pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    token_offset = (block * stride_cache_block + (pos % BLOCK_SIZE) * stride_cache_slot
                    + head_offset)
    kv_offset = token_offset[:, None] + offs_d[None, :]
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + kv_offset, mask=kv_mask, other=0.0).to(q.dtype)
    scores = mma(q, tl.trans(k), DOT_PRECISION, DOT_WIDEN) * qk_scale_log2
    visible = n_mask[None, :]
    if CAUSAL:  # a constexpr: resolved when the kernel is compiled
        visible = visible & (pos[None, :] <= q_pos[:, None])
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    alpha = tl.exp2(row_max - new_max)
    probs = tl.exp2(scores - new_max[:, None])
    row_sum = row_sum * alpha + tl.sum(probs, 1)
    v = tl.load(v_cache_ptr + kv_offset, mask=kv_mask, other=0.0).to(q.dtype)
    acc = acc * alpha[:, None] + mma(probs.to(q.dtype), v, DOT_PRECISION, DOT_WIDEN)
    return acc, new_max, row_sum
