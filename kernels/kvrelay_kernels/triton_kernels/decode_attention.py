# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""Split-KV ("flash-decoding") attention for batches where every sequence has one new token.

Decode is bound by reading the KV cache, so the kernel is shaped around reading each K/V
byte once and keeping every SM busy:

- one program per (sequence, KV head, split) computes ALL query heads of that KV head's
  GQA group together (they share each K/V tile), as the rows of a ``tl.dot``;
- each loop iteration gathers ``tile_n`` context tokens (several KV blocks) through the
  block table;
- a sequence's context is cut into ``num_splits`` pieces on the device, from its real
  length, so a loose host bound (a CUDA graph's ``max_model_len``) only adds programs
  that exit at once; pieces write (max, sum, unnormalised output) to a float32 workspace
  and a small second kernel merges them. With one split the first kernel writes the
  output directly.

Scores live in the log2 domain (scaled by ``log2(e)``) so the softmax uses ``exp2``.

Under a sliding window (``WINDOWED``) a sequence's context is only its last ``window``
tokens, ``[seq_len - window, seq_len)``: the splits cut that span instead of the whole
context, so blocks before it (which the engine may have freed, leaving a NaN placeholder
in the table) are never loaded, and no key needs masking. ``SOFTCAP`` caps the scores
(see ``online_softmax``). Both are constexprs: without them the kernels compile as before.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvrelay_kernels.kv_quant import value_row_strides
from kvrelay_kernels.triton_kernels.dot import mma_precision, mma_widen
from kvrelay_kernels.triton_kernels.kv_store import quant_code
from kvrelay_kernels.triton_kernels.launch_config import DecodeConfig
from kvrelay_kernels.triton_kernels.online_softmax import attend_tile


@triton.jit
def _split_tokens(seq_len, num_splits, TILE_N: tl.constexpr):
    """Context tokens per split for this sequence: a whole number of tiles."""
    per_split = (seq_len + num_splits - 1) // num_splits
    return (per_split + TILE_N - 1) // TILE_N * TILE_N


@triton.jit
def _first_key(seq_len, window, WINDOWED: tl.constexpr):
    """The first context token the (single) new token sees: 0, or its window's start."""
    first = 0
    if WINDOWED:
        first = tl.maximum(seq_len - window, 0)
    return first


# The split count follows the batch and context: not specialised on, so a new value does
# not compile a new kernel while serving.
@triton.jit(do_not_specialize=["num_splits"])
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_loc_ptr, seq_lens_ptr,
    out_ptr, part_max_ptr, part_sum_ptr, part_acc_ptr,
    qk_scale_log2, window, softcap_log2,
    stride_qt, stride_qh,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    stride_bt,
    stride_ot, stride_oh,
    num_heads, num_splits,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_WIDEN: tl.constexpr,
    WINDOWED: tl.constexpr, SOFTCAP: tl.constexpr, QUANT: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    first_key = _first_key(seq_len, window, WINDOWED)
    split_tokens = _split_tokens(seq_len - first_key, num_splits, TILE_N)
    kv_start = first_key + split * split_tokens
    # Not a decode sequence (padding), or a split past this context: nothing to do. Split
    # 0 always runs so an empty context still yields a defined (zero) result.
    if (q_len != 1) | ((split > 0) & (kv_start >= seq_len)):
        return
    kv_end = tl.minimum(kv_start + split_tokens, seq_len)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    offs_n = tl.arange(0, TILE_N)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD
    heads = kv_head * GROUP + offs_g
    q = tl.load(
        q_ptr + q_start.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :], other=0.0,
    )

    row_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    row_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    head_offset = kv_head.to(tl.int64) * stride_cache_head
    for tile_start in range(kv_start, kv_end, TILE_N):
        acc, row_max, row_sum = attend_tile(
            q, acc, row_max, row_sum, row_max,  # q_pos unused: every key is visible
            k_cache_ptr, v_cache_ptr, table, head_offset,
            tile_start, kv_end, offs_n, offs_d, d_mask,
            stride_cache_block, stride_cache_slot, qk_scale_log2, window, softcap_log2,
            BLOCK_SIZE, False, DOT_PRECISION, DOT_WIDEN,
            False, SOFTCAP,  # the split range is the window already: no window mask
            HEAD, QUANT,
        )

    if DIRECT:
        result = acc / tl.where(row_sum > 0, row_sum, 1.0)[:, None]
        tl.store(
            out_ptr + q_start.to(tl.int64) * stride_ot + heads[:, None] * stride_oh
            + offs_d[None, :],
            result.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :],
        )
    else:
        part = (seq.to(tl.int64) * num_heads + heads) * num_splits + split
        tl.store(part_max_ptr + part, row_max, mask=g_mask)
        tl.store(part_sum_ptr + part, row_sum, mask=g_mask)
        tl.store(part_acc_ptr + part[:, None] * HEAD + offs_d[None, :], acc,
                 mask=g_mask[:, None] & d_mask[None, :])


@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(
    out_ptr, part_max_ptr, part_sum_ptr, part_acc_ptr, query_start_loc_ptr, seq_lens_ptr,
    window,
    stride_ot, stride_oh,
    num_heads, num_splits,
    HEAD: tl.constexpr, HEAD_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr, TILE_N: tl.constexpr, WINDOWED: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_len != 1:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    span = seq_len - _first_key(seq_len, window, WINDOWED)
    split_tokens = _split_tokens(span, num_splits, TILE_N)
    # The same split arithmetic as the first kernel: splits at or past the end are empty.
    num_valid = (span + split_tokens - 1) // tl.maximum(split_tokens, 1)

    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    s_mask = offs_s < num_valid
    d_mask = offs_d < HEAD
    part = (seq.to(tl.int64) * num_heads + head) * num_splits + offs_s
    maxes = tl.load(part_max_ptr + part, mask=s_mask, other=float("-inf"))
    global_max = tl.max(maxes, 0)
    weights = tl.where(s_mask, tl.exp2(maxes - global_max), 0.0)
    sums = tl.load(part_sum_ptr + part, mask=s_mask, other=0.0)
    total = tl.sum(weights * sums, 0)
    accs = tl.load(part_acc_ptr + part[:, None] * HEAD + offs_d[None, :],
                   mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    result = tl.sum(weights[:, None] * accs, 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + q_start.to(tl.int64) * stride_ot + head * stride_oh + offs_d,
             result.to(out_ptr.dtype.element_ty), mask=d_mask)


def decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    config: DecodeConfig,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> None:
    """Launch the split kernel (and the reduce when ``config.num_splits > 1``) into ``out``.

    Sequences whose query length is not exactly 1 are left untouched. No device value is
    read on the host, so this is safe inside CUDA graph capture. ``sliding_window`` and
    ``softcap`` (host values, None when unused) become runtime arguments plus constexpr
    switches: one compiled variant per combination in use, whatever the values.
    """
    num_seqs = seq_lens.shape[0]
    num_heads, head_size = query.shape[1], query.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    num_splits = config.num_splits
    direct = num_splits == 1
    if direct:
        part_max = part_sum = part_acc = out  # unused placeholders
    else:
        part_max = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32,
                               device=query.device)
        part_sum = torch.empty_like(part_max)
        part_acc = torch.empty((num_seqs, num_heads, num_splits, head_size),
                               dtype=torch.float32, device=query.device)
    quant = quant_code(key_cache.dtype)
    if quant:  # the kernel reads quantized caches as bytes (value rows, then the scales)
        key_cache, value_cache = key_cache.view(torch.int8), value_cache.view(torch.int8)
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens,
        out, part_max, part_sum, part_acc,
        scale * math.log2(math.e), sliding_window or 0,
        (softcap or 0.0) * math.log2(math.e),
        query.stride(0), query.stride(1),
        *value_row_strides(key_cache),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        num_heads, num_splits,
        GROUP=num_heads // num_kv_heads, GROUP_PAD=config.group_pad,
        HEAD=head_size, HEAD_PAD=config.head_pad,
        BLOCK_SIZE=block_size, TILE_N=config.tile_n,
        DIRECT=direct,
        DOT_PRECISION=mma_precision(query.dtype), DOT_WIDEN=mma_widen(query.dtype),
        WINDOWED=sliding_window is not None, SOFTCAP=softcap is not None, QUANT=quant,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if direct:
        return
    _decode_reduce_kernel[(num_seqs, num_heads)](
        out, part_max, part_sum, part_acc, query_start_loc, seq_lens,
        sliding_window or 0,
        out.stride(0), out.stride(1),
        num_heads, num_splits,
        HEAD=head_size, HEAD_PAD=config.head_pad,
        SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)), TILE_N=config.tile_n,
        WINDOWED=sliding_window is not None,
        num_warps=4,
    )
