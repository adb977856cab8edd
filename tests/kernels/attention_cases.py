"""Random paged-attention batches for the kernel tests, built to expose stray reads.

Each batch comes twice: ``clean`` for the reference (which reads padding and masks it)
and ``poisoned`` for the kernel, where every cache slot past a sequence's length and every
block-table entry past its last block points at NaN. A kernel that reads anything it must
not turns its output into NaN.

For sliding windows, ``free_outside_window`` does what the engine does to blocks no window
reaches any more (NaN contents, table entries at one shared placeholder block), and
``dense_attention`` is the naive oracle: every sequence's context laid out in full, one
explicit mask, float64.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch


@dataclass
class PagedBatch:
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.query, self.key_cache, self.value_cache, self.block_tables,
                self.query_start_loc, self.seq_lens)


def make_batch(
    query_lens: list[int],
    seq_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    device: str,
    num_blocks: int | None = None,
    table_width: int | None = None,
) -> tuple[PagedBatch, PagedBatch]:
    """Return ``(clean, poisoned)`` views of one batch with shuffled blocks.

    ``num_blocks``/``table_width`` fix the cache and block-table sizes (so batches of
    different lengths can share one CUDA graph); by default they are just big enough.
    """
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    if num_blocks is None:
        num_blocks = sum(blocks_per_seq) + 4
    assert num_blocks > sum(blocks_per_seq), "the last block is the poison"
    poison = num_blocks - 1
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.randn(shape, dtype=torch.float32).to(dtype)
    value_cache = torch.randn(shape, dtype=torch.float32).to(dtype)
    order = torch.randperm(num_blocks - 1)
    width = table_width if table_width is not None else max(blocks_per_seq) + 2
    clean_tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    poison_tables = torch.full((len(seq_lens), width), poison, dtype=torch.int32)
    used = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    start = 0
    for i, (n_blocks, n_tokens) in enumerate(zip(blocks_per_seq, seq_lens)):
        mine = order[start : start + n_blocks].to(torch.int32)
        start += n_blocks
        clean_tables[i, :n_blocks] = mine
        poison_tables[i, :n_blocks] = mine
        used[mine.long()] = (
            torch.arange(n_blocks * block_size).view(n_blocks, block_size) < n_tokens
        )
    poisoned_k, poisoned_v = key_cache.clone(), value_cache.clone()
    poisoned_k[~used] = float("nan")
    poisoned_v[~used] = float("nan")
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    query = torch.randn(int(starts[-1]), num_heads, head_size).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)

    def on_device(k: torch.Tensor, v: torch.Tensor, tables: torch.Tensor) -> PagedBatch:
        return PagedBatch(query.to(device), k.to(device), v.to(device), tables.to(device),
                          starts.to(device), lens.to(device))

    return on_device(key_cache, value_cache, clean_tables), on_device(
        poisoned_k, poisoned_v, poison_tables)


# Absolute/relative tolerances per dtype for attention outputs (|v| ~ 1).
TOLERANCES = {
    torch.float32: (2e-5, 1e-5),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (3e-2, 2e-2),
}


def free_outside_window(batch: PagedBatch, window: int) -> tuple[PagedBatch, int]:
    """Free, as the engine does, every block wholly before all of a sequence's windows.

    A copy of ``batch`` where those blocks hold NaN and their table entries point at one
    shared placeholder (the cache's last block, which ``make_batch`` never hands out, also
    NaN). Returns it with the number of table entries freed, so a test can check that its
    case frees something.
    """
    key_cache, value_cache = batch.key_cache.clone(), batch.value_cache.clone()
    tables = batch.block_tables.clone()
    block_size, placeholder = key_cache.shape[1], key_cache.shape[0] - 1
    key_cache[placeholder] = float("nan")
    value_cache[placeholder] = float("nan")
    starts, lens = batch.query_start_loc.tolist(), batch.seq_lens.tolist()
    freed = 0
    for i, seq_len in enumerate(lens):
        query_len = starts[i + 1] - starts[i]
        first_seen = max(0, seq_len - query_len - window + 1)  # its first token's window
        n_free = first_seen // block_size
        blocks = tables[i, :n_free].long()
        key_cache[blocks] = float("nan")
        value_cache[blocks] = float("nan")
        tables[i, :n_free] = placeholder
        freed += n_free
    return replace(batch, key_cache=key_cache, value_cache=value_cache,
                   block_tables=tables), freed


def dense_attention(batch: PagedBatch, scale: float, *, sliding_window: int | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """The naive oracle, in float64: each sequence's whole context gathered slot by slot,
    full scores, ``softcap * tanh(s / softcap)``, then one causal (and window) mask."""
    query = batch.query.double()
    out = torch.zeros_like(query)
    num_heads, head_size = query.shape[1], query.shape[2]
    block_size, num_kv_heads = batch.key_cache.shape[1], batch.key_cache.shape[2]
    flat_k = batch.key_cache.reshape(-1, num_kv_heads, head_size).double()
    flat_v = batch.value_cache.reshape(-1, num_kv_heads, head_size).double()
    starts, lens = batch.query_start_loc.tolist(), batch.seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        start, end = starts[i], starts[i + 1]
        pos = torch.arange(seq_len)
        table = batch.block_tables[i].cpu().long()
        slots = table[pos // block_size] * block_size + pos % block_size
        group = num_heads // num_kv_heads
        keys = flat_k[slots.to(flat_k.device)].repeat_interleave(group, dim=1)
        values = flat_v[slots.to(flat_v.device)].repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[start:end], keys) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = torch.arange(seq_len - (end - start), seq_len)[:, None]
        mask = pos[None, :] <= q_pos
        if sliding_window is not None:
            mask &= pos[None, :] > q_pos - sliding_window
        scores = scores.masked_fill(~mask.to(scores.device), float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)
    return out


# The quantized KV cache dtypes, as pytest parameters.
QUANT_DTYPES = [pytest.param(torch.int8, id="int8"),
                pytest.param(torch.float8_e4m3fn, id="fp8")]
