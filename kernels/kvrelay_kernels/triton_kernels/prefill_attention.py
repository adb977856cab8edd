# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""Variable-length causal attention over the paged cache: prefill, chunks and mixed batches.

Each program owns one tile of a sequence's new tokens for one KV head. Its rows are
(token, query head of the GQA group) pairs, so one K/V tile feeds the whole group, and it
walks the context up to its last token's position (keys before the new tokens are fully
visible; among the new tokens the mask is causal). Decode sequences (one new token) work
here too, which is what a mixed batch needs.

The grid is flat over query tiles without reading query lengths on the host: sequence
``i`` owns the virtual tiles ``[start_i // BLOCK_Q + i, start_{i+1} // BLOCK_Q + i + 1)``,
a range at least as long as the ``ceil(len_i / BLOCK_Q)`` tiles it needs, so
``num_tokens // BLOCK_Q + num_seqs`` programs always suffice; each program finds its
sequence by binary search over ``query_start_loc`` and surplus programs exit.

Under a sliding window (``WINDOWED``) a program's walk starts at its first row's window
start, ``max(0, q_pos - window + 1)``, not at 0: blocks wholly before that (which the
engine may have freed, leaving a NaN placeholder in the table) are never loaded, and the
later rows mask the keys before their own windows. ``SOFTCAP`` caps the scores (see
``online_softmax``). Both are constexprs: without them the kernel compiles as before.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvrelay_kernels.kv_quant import value_row_strides
from kvrelay_kernels.triton_kernels.dot import mma_precision, mma_widen
from kvrelay_kernels.triton_kernels.kv_store import quant_code
from kvrelay_kernels.triton_kernels.launch_config import PrefillConfig
from kvrelay_kernels.triton_kernels.online_softmax import attend_tile


@triton.jit
def _find_sequence(query_start_loc_ptr, virtual_tile, num_seqs, BLOCK_Q: tl.constexpr):
    """The last sequence whose first virtual tile is at or before ``virtual_tile``."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        before = first_tile <= virtual_tile
        lo = tl.where(before, mid, lo)
        hi = tl.where(before, hi, mid)
    return lo


# The batch's sequence count changes every step: not specialised on (no new compile).
@triton.jit(do_not_specialize=["num_seqs"])
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_loc_ptr, seq_lens_ptr,
    out_ptr,
    qk_scale_log2, window, softcap_log2,
    stride_qt, stride_qh,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    stride_bt,
    stride_ot, stride_oh,
    num_seqs,
    GROUP: tl.constexpr, HEAD: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_WIDEN: tl.constexpr,
    WINDOWED: tl.constexpr, SOFTCAP: tl.constexpr, QUANT: tl.constexpr,
):
    virtual_tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(query_start_loc_ptr, virtual_tile, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tile = virtual_tile - (q_start // BLOCK_Q + seq)
    if tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_PAD)
    offs_n = tl.arange(0, TILE_N)
    token = tile * BLOCK_Q + offs_m // GROUP  # index among this sequence's new tokens
    heads = kv_head * GROUP + offs_m % GROUP
    m_mask = (offs_m < BLOCK_Q * GROUP) & (token < q_len)
    d_mask = offs_d < HEAD
    q_rows = (q_start + token).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    # Padding rows get real positions too: key 0 is then visible to every row, so no row's
    # running max stays -inf (which would turn into NaN); their results are not stored.
    # (Under a window a row may see nothing for a while; attend_tile guards that case.)
    q_pos = context_len + token
    kv_end = tl.minimum(seq_len, context_len + (tile + 1) * BLOCK_Q)
    kv_begin = 0
    if WINDOWED:  # the first row's window start: no row sees anything before it
        kv_begin = tl.maximum(context_len + tile * BLOCK_Q - window + 1, 0)

    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    head_offset = kv_head.to(tl.int64) * stride_cache_head
    for tile_start in range(kv_begin, kv_end, TILE_N):
        acc, row_max, row_sum = attend_tile(
            q, acc, row_max, row_sum, q_pos,
            k_cache_ptr, v_cache_ptr, table, head_offset,
            tile_start, kv_end, offs_n, offs_d, d_mask,
            stride_cache_block, stride_cache_slot, qk_scale_log2, window, softcap_log2,
            BLOCK_SIZE, True, DOT_PRECISION, DOT_WIDEN, WINDOWED, SOFTCAP, HEAD, QUANT,
        )

    if WINDOWED:  # padding rows may have seen no key at all: 0 / 0 (never stored)
        row_sum = tl.where(row_sum > 0, row_sum, 1.0)
    result = acc / row_sum[:, None]
    o_rows = (q_start + token).to(tl.int64)
    tl.store(out_ptr + o_rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             result.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    config: PrefillConfig,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> None:
    """Launch the variable-length kernel over every sequence of the batch into ``out``.

    The grid depends only on ``query.shape[0]`` and the number of sequences, so this is
    safe inside CUDA graph capture. ``sliding_window`` and ``softcap`` (host values, None
    when unused) become runtime arguments plus constexpr switches, as in the decode path.
    """
    num_tokens, num_heads, head_size = query.shape
    num_seqs = seq_lens.shape[0]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    grid = (num_tokens // config.block_q + num_seqs, num_kv_heads)
    quant = quant_code(key_cache.dtype)
    if quant:  # the kernel reads quantized caches as bytes (value rows, then the scales)
        key_cache, value_cache = key_cache.view(torch.int8), value_cache.view(torch.int8)
    _prefill_kernel[grid](
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, out,
        scale * math.log2(math.e), sliding_window or 0,
        (softcap or 0.0) * math.log2(math.e),
        query.stride(0), query.stride(1),
        *value_row_strides(key_cache),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        num_seqs,
        GROUP=num_heads // num_kv_heads, HEAD=head_size, HEAD_PAD=config.head_pad,
        BLOCK_SIZE=block_size, BLOCK_M=config.block_m, BLOCK_Q=config.block_q,
        TILE_N=config.tile_n,
        DOT_PRECISION=mma_precision(query.dtype), DOT_WIDEN=mma_widen(query.dtype),
        WINDOWED=sliding_window is not None, SOFTCAP=softcap is not None, QUANT=quant,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
