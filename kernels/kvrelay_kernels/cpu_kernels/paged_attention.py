"""Paged attention on CPU without the gather copy: the compiled kernel, or None.

The compiled kernel (``paged_attention.cpp``) reads each sequence's keys and values
straight from the blocks its table names, once, with an online softmax. It serves the
sequences with few new tokens (decode, short verification queries): there a query is a
vector and the reference's gather copy costs more than the attention itself. Sequences with
many new tokens (prompt chunks) stay with the reference, whose one gather per sequence is
amortised over all its queries and whose SDPA runs them as matrix products.
"""

from __future__ import annotations

import itertools

import torch

from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
from kvrelay_kernels.reference.paged_attention import paged_attention_reference

# Sequences with at most this many new tokens go to the compiled kernel, which reads the
# context once per query token; longer queries run as matrix products in the reference.
MAX_KERNEL_QUERY_LEN = 4
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def cpu_kernel_usable(query: torch.Tensor, key_cache: torch.Tensor,
                      out: torch.Tensor | None = None) -> bool:
    """Whether the compiled kernel can serve this call (else: the reference serves it all)."""
    return (query.device.type == "cpu" and query.dtype in KERNEL_DTYPES
            and key_cache.dtype == query.dtype and (out is None or out.dtype == query.dtype)
            and load_cpu_kernels())


def paged_attention_cpu(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    *,
    sliding_window: int | None,
    softcap: float | None,
    max_query_len: int = MAX_KERNEL_QUERY_LEN,
) -> None:
    """Fill ``out``'s rows of every sequence with 1..``max_query_len`` new tokens.

    Arguments as ``paged_attention`` (already checked); rows of longer queries are left
    untouched for the caller. Requires ``cpu_kernel_usable`` to be true.
    """
    torch.ops.kvrelay_cpu.paged_attention(
        query, key_cache, value_cache,
        block_tables.to(torch.int32).contiguous(),
        query_start_loc.to(torch.int32).contiguous(),
        seq_lens.to(torch.int32).contiguous(),
        float(scale), 0.0 if softcap is None else float(softcap),
        0 if sliding_window is None else int(sliding_window), int(max_query_len), out,
    )


def paged_attention_cpu_dispatch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None,
    sliding_window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """``paged_attention`` on CPU: short queries in the compiled kernel, long ones (and
    every call the kernel cannot serve) in the reference, each sequence exactly once."""
    if out is None:
        out = torch.empty_like(query)
    if not cpu_kernel_usable(query, key_cache, out):
        return paged_attention_reference(
            query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
            out=out, sliding_window=sliding_window, softcap=softcap)
    starts = query_start_loc.tolist()
    query_lens = [b - a for a, b in itertools.pairwise(starts)]
    if any(0 < n <= MAX_KERNEL_QUERY_LEN for n in query_lens):
        paged_attention_cpu(query, key_cache, value_cache, block_tables, query_start_loc,
                            seq_lens, scale, out, sliding_window=sliding_window,
                            softcap=softcap)
    for i, n in enumerate(query_lens):
        if n > MAX_KERNEL_QUERY_LEN:
            first = starts[i]
            paged_attention_reference(
                query[first : first + n], key_cache, value_cache, block_tables[i : i + 1],
                query_start_loc.new_tensor([0, n]), seq_lens[i : i + 1], scale,
                out=out[first : first + n], sliding_window=sliding_window, softcap=softcap)
    return out
