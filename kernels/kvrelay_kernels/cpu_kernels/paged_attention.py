"""Paged attention on CPU without the gather copy: the compiled kernels, or the reference.

Two compiled kernels read each sequence's keys and values straight from the blocks its
table names. One-token queries (decode) go to ``paged_attention.cpp``, which streams the
context once per sequence and KV head as vectors; every longer query (prompt chunks, fresh
or after a prefix-cache hit, speculative verification) goes to ``tiled_attention.cpp``,
which reads K/V tiles once per tile of query tokens and runs them as matrix products
(sgemm on one worker; blocked loops when several share the call, see the .cpp).
The tiled kernel beats the reference's gather + SDPA at every prompt-chunk size, fresh
prefill included (``benchmarks/cpu_attention.py`` compares them per layer), so the
reference only serves calls the kernels cannot.
"""

from __future__ import annotations

import torch

from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
from kvrelay_kernels.reference.paged_attention import paged_attention_reference

# Queries of at most this many new tokens run in the decode kernel, longer ones in the
# tiled kernel: the decode kernel wins only for a single token; from two tokens on, the
# tiled one reads each K/V tile once for all of them and wins by more as queries grow.
DECODE_QUERY_LEN = 1
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def cpu_kernel_usable(query: torch.Tensor, key_cache: torch.Tensor,
                      out: torch.Tensor | None = None) -> bool:
    """Whether the compiled kernels can serve this call (else: the reference serves it all)."""
    return (query.device.type == "cpu" and query.dtype in KERNEL_DTYPES
            and key_cache.dtype == query.dtype and (out is None or out.dtype == query.dtype)
            and load_cpu_kernels())


def as_int32(index: torch.Tensor) -> torch.Tensor:
    """The kernels' index layout. The model runner builds its metadata as contiguous int32
    once per step, so there this returns ``index`` itself: no per-layer copy."""
    return index.to(torch.int32).contiguous()


def paged_attention_decode_cpu(
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
    max_query_len: int = DECODE_QUERY_LEN,
) -> None:
    """Fill ``out``'s rows of every sequence with 1..``max_query_len`` new tokens (decode
    kernel; others' rows untouched). Arguments as ``paged_attention``, already checked."""
    torch.ops.kvrelay_cpu.paged_attention(
        query, key_cache, value_cache, as_int32(block_tables), as_int32(query_start_loc),
        as_int32(seq_lens), float(scale), 0.0 if softcap is None else float(softcap),
        0 if sliding_window is None else int(sliding_window), int(max_query_len), out,
    )


def paged_attention_tiled_cpu(
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
    min_query_len: int = DECODE_QUERY_LEN + 1,
) -> None:
    """Fill ``out``'s rows of every sequence with at least ``min_query_len`` new tokens
    (tiled kernel; others' rows untouched). Arguments as ``paged_attention``."""
    torch.ops.kvrelay_cpu.paged_attention_tiled(
        query, key_cache, value_cache, as_int32(block_tables), as_int32(query_start_loc),
        as_int32(seq_lens), float(scale), 0.0 if softcap is None else float(softcap),
        0 if sliding_window is None else int(sliding_window), int(min_query_len), out,
    )


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
) -> None:
    """Fill every row of ``out``: one-token queries in the decode kernel, the rest in the
    tiled kernel (each skips, in C++, the sequences that are not its own; the tiled one
    returns at once when it has none). Requires ``cpu_kernel_usable`` to be true."""
    tables, starts, lens = as_int32(block_tables), as_int32(query_start_loc), as_int32(seq_lens)
    paged_attention_decode_cpu(query, key_cache, value_cache, tables, starts, lens, scale, out,
                               sliding_window=sliding_window, softcap=softcap)
    paged_attention_tiled_cpu(query, key_cache, value_cache, tables, starts, lens, scale, out,
                              sliding_window=sliding_window, softcap=softcap)


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
    """``paged_attention`` on CPU: the compiled kernels where usable, else the reference.

    No host-side look at the batch (no ``tolist``): each kernel picks its sequences from
    ``query_start_loc`` itself, so a layer call costs two op launches, not a sync.
    """
    if out is None:
        out = torch.empty_like(query)
    if not cpu_kernel_usable(query, key_cache, out):
        return paged_attention_reference(
            query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
            out=out, sliding_window=sliding_window, softcap=softcap)
    paged_attention_cpu(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens,
                        scale, out, sliding_window=sliding_window, softcap=softcap)
    return out


def set_tiled_blas(enable: bool) -> bool:
    """Let the tiled kernel's matrix products run in BLAS sgemm (the default) or in its
    portable blocked loops (the fallback where torch links no sgemm), to test and measure
    the fallback; returns whether sgemm runs now. Requires ``load_cpu_kernels()``."""
    return bool(torch.ops.kvrelay_cpu.tiled_attention_use_blas(enable))


def parallel_team_size() -> int:
    """Threads one of the kernels' parallel loops runs on now: ``torch.get_num_threads()``
    when the library was built with OpenMP, 1 when a build without it would run serially.
    Requires ``load_cpu_kernels()``."""
    return int(torch.ops.kvrelay_cpu.parallel_team_size())
