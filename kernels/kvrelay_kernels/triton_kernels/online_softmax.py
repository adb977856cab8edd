# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""One step of the attention loop both kernels share: a context tile through online softmax.

The decode and the prefill kernel walk a sequence's context ``TILE_N`` tokens at a time:
gather the tile's K and V through the block table, score the program's query rows
against K, and fold the scores into the running max, sum and (unnormalised) output. Only
which keys a row may see differs: every key before ``kv_end`` for decode, and causally
(``pos <= q_pos``) for prefill, chosen by ``CAUSAL``. Scores are in the log2 domain.

Two constexpr options, off by default so the plain kernels compile exactly as before:

- ``WINDOWED`` (sliding window, with ``CAUSAL``): a row also hides keys at or before
  ``q_pos - window``. The callers start their loops at the first key a window can reach,
  so freed blocks are never loaded; this mask handles the rows of a tile whose windows
  start later. A row may then see no key of a whole tile: its max stays -inf, and
  ``exp2(-inf - -inf)`` would be NaN, so that row's exponentials are shifted by 0 instead
  (giving 0, its sums stay 0; the max itself stays -inf).
- ``SOFTCAP``: scores ``s`` become ``c * tanh(s / c)`` (Gemma 2), with ``softcap_log2``
  the cap ``c`` in the log2 domain (``c * log2(e)``, since scores are already scaled by
  ``log2(e)`` and ``tanh`` commutes with that scaling as ``k * tanh(x / k)``). Triton has
  no ``tanh`` in every version; ``(1 - e) / (1 + e)`` with ``e = exp(-2|y|)`` in ``(0, 1]``
  never overflows.

``QUANT`` (1 int8, 2 float8 e4m3; 0 float) reads a quantized cache (``kv_quant``): the
caches come as int8 bytes, each block its rows of ``HEAD`` values (16-byte aligned; the
callers pass the value rows' strides, ``kv_quant.value_row_strides``) followed by one
power-of-two exponent byte per row, at the tail's start plus the row's offset / ``HEAD``;
each tile's values are scaled back to floats right after their load.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kvrelay_kernels.triton_kernels.dot import mma


@triton.jit
def _tanh(y):
    """``tanh`` from ``exp2`` alone, for any finite ``y`` (no overflow: ``e`` is in (0, 1])."""
    e = tl.exp2(-2.8853900817779268 * tl.abs(y))  # exp(-2|y|); the constant is 2 * log2(e)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(y < 0, -t, t)


@triton.jit
def _load_rows(cache_ptr, kv_offset, scale_offset, kv_mask, n_mask, dtype,
               QUANT: tl.constexpr):
    """A tile's K or V rows as ``dtype``, dequantized when the cache is quantized."""
    if QUANT:
        raw = tl.load(cache_ptr + kv_offset, mask=kv_mask, other=0)
        if QUANT == 1:
            values = raw.to(tl.float32)
        else:
            values = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        exponent = tl.load(cache_ptr + scale_offset, mask=n_mask, other=0)
        scale = ((exponent.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
        return (values * scale[:, None]).to(dtype)
    return tl.load(cache_ptr + kv_offset, mask=kv_mask, other=0.0).to(dtype)


@triton.jit
def attend_tile(
    q, acc, row_max, row_sum, q_pos,
    k_cache_ptr, v_cache_ptr, table, head_offset,
    tile_start, kv_end, offs_n, offs_d, d_mask,
    stride_cache_block, stride_cache_slot, qk_scale_log2, window, softcap_log2,
    BLOCK_SIZE: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_WIDEN: tl.constexpr,
    WINDOWED: tl.constexpr, SOFTCAP: tl.constexpr,
    HEAD: tl.constexpr = 0, QUANT: tl.constexpr = 0,
):
    """Fold context tokens ``tile_start + offs_n`` into ``(acc, row_max, row_sum)``.

    ``window`` is read only when ``WINDOWED``, ``softcap_log2`` only when ``SOFTCAP``.
    """
    pos = tile_start + offs_n
    n_mask = pos < kv_end
    block = tl.load(table + pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    block_start = block * stride_cache_block
    in_block = (pos % BLOCK_SIZE) * stride_cache_slot + head_offset
    token_offset = block_start + in_block
    scale_offset = token_offset
    if QUANT:  # the block's scale tail follows its BLOCK_SIZE slots of value rows
        scale_offset = block_start + BLOCK_SIZE * stride_cache_slot + in_block // HEAD
    kv_offset = token_offset[:, None] + offs_d[None, :]
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = _load_rows(k_cache_ptr, kv_offset, scale_offset, kv_mask, n_mask, q.dtype, QUANT)
    scores = mma(q, tl.trans(k), DOT_PRECISION, DOT_WIDEN) * qk_scale_log2
    if SOFTCAP:  # constexprs below too: resolved when the kernel is compiled
        scores = softcap_log2 * _tanh(scores * (1.0 / softcap_log2))
    visible = n_mask[None, :]
    if CAUSAL:
        visible = visible & (pos[None, :] <= q_pos[:, None])
        if WINDOWED:
            visible = visible & (pos[None, :] > q_pos[:, None] - window)
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    shift = new_max
    if WINDOWED:  # a row that has seen nothing yet: keep its sums at 0, not NaN
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
    alpha = tl.exp2(row_max - shift)
    probs = tl.exp2(scores - shift[:, None])
    row_sum = row_sum * alpha + tl.sum(probs, 1)
    v = _load_rows(v_cache_ptr, kv_offset, scale_offset, kv_mask, n_mask, q.dtype, QUANT)
    acc = acc * alpha[:, None] + mma(probs.to(q.dtype), v, DOT_PRECISION, DOT_WIDEN)
    return acc, new_max, row_sum
