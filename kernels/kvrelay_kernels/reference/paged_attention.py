"""Attention over a paged KV cache for a flattened batch of variable-length queries.

One interface serves every phase: a sequence's new tokens (one for decode, many for a
prompt chunk or a prefill after a prefix-cache hit) attend causally to everything before
them, read through the sequence's block table. Sequences with a single new token are
computed together in one padded batch; longer queries one sequence at a time, so the
Python loop runs per sequence, never per token.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F


def _gather_context(
    cache: torch.Tensor, block_table: torch.Tensor, length: int
) -> torch.Tensor:
    """Return ``[length, num_kv_heads, head_size]``: a sequence's first tokens in order."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    blocks = cache[block_table[:num_blocks].to(torch.int64)]
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:length]


def _decode_batch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One new token per sequence: ``query`` is ``[batch, num_heads, head_size]``.

    The blocks are gathered once with ``index_select`` and handed to SDPA as a strided
    view (no further copy); the batch pads to its longest context under a mask. On CPU
    this is several times faster than batched matmuls over permuted copies.
    """
    batch, head_size = query.shape[0], query.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    max_len = int(seq_lens.max())
    num_blocks = -(-max_len // block_size)
    index = block_tables[:, :num_blocks].reshape(-1).to(torch.int64)
    padded = num_blocks * block_size
    keys = key_cache.index_select(0, index).view(batch, padded, num_kv_heads, head_size)
    values = value_cache.index_select(0, index).view(batch, padded, num_kv_heads, head_size)
    positions = torch.arange(padded, device=query.device)
    mask = positions[None, :] < seq_lens.to(query.device)[:, None]
    out = F.scaled_dot_product_attention(
        query[:, :, None, :],
        keys.transpose(1, 2).to(query.dtype),
        values.transpose(1, 2).to(query.dtype),
        attn_mask=mask[:, None, None, :],
        scale=scale,
        enable_gqa=True,
    )
    return out[:, :, 0, :]


def _prefill_one(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
) -> torch.Tensor:
    """Many new tokens of one sequence: causal among themselves, full over the prefix."""
    query_len = query.shape[0]
    keys = _gather_context(key_cache, block_table, seq_len).to(query.dtype)
    values = _gather_context(value_cache, block_table, seq_len).to(query.dtype)
    key_pos = torch.arange(seq_len, device=query.device)
    query_pos = torch.arange(seq_len - query_len, seq_len, device=query.device)
    mask = key_pos[None, :] <= query_pos[:, None]
    out = F.scaled_dot_product_attention(
        query.transpose(0, 1),
        keys.transpose(0, 1),
        values.transpose(0, 1),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
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
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole context.

    Shapes: ``query`` ``[num_tokens, num_heads, head_size]``; caches
    ``[num_blocks, block_size, num_kv_heads, head_size]``; ``block_tables``
    ``[num_seqs, max_blocks]``; ``query_start_loc`` ``[num_seqs + 1]`` (offsets of each
    sequence's new tokens in ``query``); ``seq_lens`` ``[num_seqs]`` (context length
    including the new tokens). The new tokens' K/V must already be in the cache.
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
        out[index] = _decode_batch(
            query[index], key_cache, value_cache, block_tables[rows], seq_lens[rows], scale
        ).to(out.dtype)
    for i, n in enumerate(query_lens):
        if n > 1:
            start = starts[i]
            out[start : start + n] = _prefill_one(
                query[start : start + n], key_cache, value_cache, block_tables[i], lengths[i], scale
            ).to(out.dtype)
    return out
