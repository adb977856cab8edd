"""Paged attention on Triton: pick the decode or the variable-length kernel for a batch.

An all-decode batch (``max_query_len == 1``) takes the split-KV decode kernel, built to
stream the KV cache at memory bandwidth; anything with a longer query (prefill, chunked
prefill, prefix-cache hits, or a mix with decodes) takes the variable-length kernel.
Given ``max_query_len`` and ``max_seq_len`` nothing here reads the device, so the call
can be captured in a CUDA graph; ``sliding_window`` and ``softcap`` are host values too.
"""

from __future__ import annotations

import torch

from kvrelay_kernels.triton_kernels.decode_attention import decode_attention
from kvrelay_kernels.triton_kernels.launch_config import decode_config, prefill_config
from kvrelay_kernels.triton_kernels.prefill_attention import prefill_attention


def _max_query_len(query_start_loc: torch.Tensor) -> int:
    """Host-side bound when the caller gave none (synchronises with the device)."""
    if query_start_loc.shape[0] < 2:
        return 0
    return int((query_start_loc[1:] - query_start_loc[:-1]).max())


def paged_attention_triton(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its paged context.

    Same contract as ``kvrelay_kernels.paged_attention`` (arguments already checked).
    Under a window no decode split needs to cover more than ``sliding_window`` tokens, so
    the split count is planned from ``min(max_seq_len, sliding_window)``.
    ``max_query_len``/``max_seq_len`` are host upper bounds; when omitted they are read
    from the device, which synchronises and cannot be captured in a CUDA graph.
    """
    if out is None:
        out = torch.empty_like(query)
    num_seqs = seq_lens.shape[0]
    if query.shape[0] == 0 or num_seqs == 0:
        return out
    num_heads, head_size = query.shape[1], query.shape[2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    if max_query_len is None:
        max_query_len = _max_query_len(query_start_loc)
    if max_query_len <= 1:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max())
        if sliding_window is not None:
            max_seq_len = min(max_seq_len, sliding_window)
        config = decode_config(
            num_seqs=num_seqs, num_heads=num_heads, num_kv_heads=num_kv_heads,
            head_size=head_size, block_size=block_size, max_seq_len=max_seq_len,
            dtype=query.dtype, device=query.device,
        )
        decode_attention(query, key_cache, value_cache, block_tables, query_start_loc,
                         seq_lens, scale, out, config, sliding_window=sliding_window,
                         softcap=softcap)
    else:
        config_p = prefill_config(
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
            block_size=block_size, dtype=query.dtype, device=query.device,
        )
        prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc,
                          seq_lens, scale, out, config_p, sliding_window=sliding_window,
                          softcap=softcap)
    return out
