"""Attention over a paged KV cache for a flattened batch of variable-length queries.

One interface serves every phase: a sequence's new tokens (one for decode, many for a
prompt chunk or a prefill after a prefix-cache hit) attend causally to everything before
them, read through the sequence's block table. Sequences with a single new token are
computed together in one padded batch; longer queries one sequence at a time, so the
Python loop runs per sequence, never per token.

Two options serve the Gemma 2/3, windowed-Mistral and Phi-3 families:

- ``sliding_window`` W: the token at position ``p`` sees only keys ``p - W < k <= p``
  (transformers' rule). The engine frees blocks lying wholly before every query's window
  and points their table entries at a placeholder block whose contents may be NaN, so
  under a window nothing before a query's window is read at all (not even to be masked:
  ``0 * NaN`` is NaN): decode gathers each sequence's window token by token, prefill
  gathers from its first query's window start.
- ``softcap`` c: scores ``s = scale * q.k`` become ``c * tanh(s / c)`` before the mask
  and softmax. SDPA cannot do that, so only then an explicit float32 path runs (as
  transformers' eager Gemma 2 attention); without it SDPA stays the fast path.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from kvrelay_kernels.kv_quant import (
    block_exponents,
    block_values,
    dequantize_blocks,
    dequantize_values,
    is_quantized_kv,
)


def _read_blocks(cache: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Blocks ``index`` of ``cache`` as ``[len(index), block_size, num_kv_heads, head_size]``
    of ``dtype``. A quantized cache's blocks are gathered as bytes (float8 has no CPU
    kernel for it) and dequantized after the gather, so only the context is expanded."""
    if is_quantized_kv(cache.dtype):
        blocks = cache.view(torch.int8).index_select(0, index).view(cache.dtype)
        return dequantize_blocks(blocks, dtype)
    return cache.index_select(0, index).to(dtype)


def _read_slots(cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Flat slots ``slots`` (``block * block_size + offset``) of ``cache`` as
    ``[len(slots), num_kv_heads, head_size]`` of ``dtype``."""
    if is_quantized_kv(cache.dtype):
        blocks, offsets = slots // cache.shape[1], slots % cache.shape[1]
        values = block_values(cache).view(torch.int8)[blocks, offsets].view(cache.dtype)
        return dequantize_values(values, block_exponents(cache)[blocks, offsets], dtype)
    return cache.view(-1, cache.shape[2], cache.shape[3]).index_select(0, slots).to(dtype)


def _gather_context(
    cache: torch.Tensor, block_table: torch.Tensor, length: int, dtype: torch.dtype
) -> torch.Tensor:
    """Return ``[length, num_kv_heads, head_size]`` of ``dtype``: a sequence's first tokens
    in order."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    blocks = _read_blocks(cache, block_table[:num_blocks].to(torch.int64), dtype)
    return blocks.reshape(-1, blocks.shape[2], blocks.shape[3])[:length]


def _attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """Masked attention with GQA: ``query`` ``[..., H, Lq, D]``, ``keys``/``values``
    ``[..., KVH, N, D]``, ``mask`` (True: visible) ``[..., 1, Lq, N]``; every row must see
    at least one key. Query head ``h`` reads KV head ``h // (H // KVH)``.

    Without ``softcap`` this is SDPA; with it, scores are capped with ``tanh`` and the
    whole computation runs in float32 (SDPA has no hook for that).
    """
    if softcap is None:
        return F.scaled_dot_product_attention(
            query, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
        )
    *batch, num_heads, query_len, head_size = query.shape
    num_kv_heads = keys.shape[-3]
    grouped = query.float().reshape(*batch, num_kv_heads, num_heads // num_kv_heads,
                                    query_len, head_size)
    scores = grouped @ keys.float().unsqueeze(-3).transpose(-1, -2) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask.unsqueeze(-3), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = probs @ values.float().unsqueeze(-3)
    return out.reshape(*batch, num_heads, query_len, head_size).to(query.dtype)


def _attend_decode(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   visible: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    """One query token per row: ``query`` ``[batch, H, D]``, gathered ``keys``/``values``
    ``[batch, N, KVH, D]``, ``visible`` ``[batch, N]``; returns ``[batch, H, D]``."""
    out = _attend(
        query[:, :, None, :],
        keys.transpose(1, 2).to(query.dtype),
        values.transpose(1, 2).to(query.dtype),
        visible[:, None, None, :],
        scale,
        softcap,
    )
    return out[:, :, 0, :]


def _decode_batch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """One new token per sequence: ``query`` is ``[batch, num_heads, head_size]``.

    The blocks are gathered once with ``index_select`` and handed to SDPA as a strided
    view (no further copy); the batch pads to its longest context under a mask. On CPU
    this is several times faster than batched matmuls over permuted copies.
    """
    batch = query.shape[0]
    block_size = key_cache.shape[1]
    max_len = int(seq_lens.max())
    num_blocks = -(-max_len // block_size)
    index = block_tables[:, :num_blocks].reshape(-1).to(torch.int64)
    padded = num_blocks * block_size
    shape = (batch, padded, key_cache.shape[2], query.shape[2])
    keys = _read_blocks(key_cache, index, query.dtype).view(shape)
    values = _read_blocks(value_cache, index, query.dtype).view(shape)
    positions = torch.arange(padded, device=query.device)
    mask = positions[None, :] < seq_lens.to(query.device)[:, None]
    return _attend_decode(query, keys, values, mask, scale, softcap)


def _decode_window_batch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int,
    softcap: float | None,
) -> torch.Tensor:
    """``_decode_batch`` under a sliding window: each sequence gathers only its own last
    ``window`` tokens, slot by slot through its block table.

    Blocks before a window may be freed placeholders full of NaN, so a padded gather from
    the batch's earliest window start (masked per row) would still poison rows through
    ``0 * NaN``. Here every gathered slot holds a real key: a row shorter than the widest
    window repeats its last token (masked out) instead of reading past its context.
    """
    batch = query.shape[0]
    block_size = key_cache.shape[1]
    lens = seq_lens.to(device=block_tables.device, dtype=torch.int64)
    width = min(window, int(lens.max()))
    first = (lens - window).clamp(min=0)
    positions = first[:, None] + torch.arange(width, device=lens.device)
    visible = positions < lens[:, None]
    positions = torch.minimum(positions, lens[:, None] - 1)
    blocks = block_tables.to(torch.int64).gather(1, positions // block_size)
    slots = (blocks * block_size + positions % block_size).reshape(-1)
    shape = (batch, width, key_cache.shape[2], query.shape[2])
    keys = _read_slots(key_cache, slots, query.dtype).view(shape)
    values = _read_slots(value_cache, slots, query.dtype).view(shape)
    return _attend_decode(query, keys, values, visible.to(query.device), scale, softcap)


def _prefill_one(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Many new tokens of one sequence: causal among themselves, full over the prefix.

    Under a ``window`` the gather starts at the first query's window start (blocks before
    it may be freed placeholders), and each query also masks keys before its own window.
    """
    query_len, block_size = query.shape[0], key_cache.shape[1]
    first = 0 if window is None else max(0, seq_len - query_len - window + 1)
    skip = first // block_size  # whole blocks before the first window: never read
    offset = skip * block_size
    table = block_table[skip:]
    keys = _gather_context(key_cache, table, seq_len - offset, query.dtype)[first - offset :]
    values = _gather_context(value_cache, table, seq_len - offset, query.dtype)[first - offset :]
    key_pos = torch.arange(first, seq_len, device=query.device)
    query_pos = torch.arange(seq_len - query_len, seq_len, device=query.device)
    mask = key_pos[None, :] <= query_pos[:, None]
    if window is not None:
        mask &= key_pos[None, :] > query_pos[:, None] - window
    out = _attend(
        query.transpose(0, 1),
        keys.transpose(0, 1),
        values.transpose(0, 1),
        mask[None],
        scale,
        softcap,
    )
    return out.transpose(0, 1)


def paged_attention_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole context.

    Shapes: ``query`` ``[num_tokens, num_heads, head_size]``; caches
    ``[num_blocks, block_size, num_kv_heads, head_size]``; ``block_tables``
    ``[num_seqs, max_blocks]``; ``query_start_loc`` ``[num_seqs + 1]`` (offsets of each
    sequence's new tokens in ``query``); ``seq_lens`` ``[num_seqs]`` (context length
    including the new tokens). The new tokens' K/V must already be in the cache.
    ``sliding_window``/``softcap``: see the module docstring (already validated).
    """
    if out is None:
        out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    lengths = seq_lens.tolist()
    query_lens = [b - a for a, b in itertools.pairwise(starts)]
    decode = [i for i, n in enumerate(query_lens) if n == 1]
    if decode:
        index = torch.tensor([starts[i] for i in decode], device=query.device)
        rows = torch.tensor(decode, device=block_tables.device)
        longest = max(lengths[i] for i in decode)
        if sliding_window is not None and sliding_window < longest:
            result = _decode_window_batch(
                query[index], key_cache, value_cache, block_tables[rows], seq_lens[rows],
                scale, sliding_window, softcap,
            )
        else:  # no window, or one that covers every context: nothing before it to skip
            result = _decode_batch(
                query[index], key_cache, value_cache, block_tables[rows], seq_lens[rows],
                scale, softcap,
            )
        out[index] = result.to(out.dtype)
    for i, n in enumerate(query_lens):
        if n > 1:
            start = starts[i]
            out[start : start + n] = _prefill_one(
                query[start : start + n], key_cache, value_cache, block_tables[i], lengths[i],
                scale, sliding_window, softcap,
            ).to(out.dtype)
    return out
