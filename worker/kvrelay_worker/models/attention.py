"""The one attention layer every model calls; it alone knows about the paged KV cache.

Models hand it projected queries, keys and values; it writes the new K/V into the
layer's cache slots and runs paged attention over each sequence's context, reading the
batch layout from ``AttentionMetadata``. Which implementation runs (Triton on CUDA, the
PyTorch reference elsewhere) is decided inside ``kvrelay_kernels``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kvrelay_kernels import paged_attention, store_kv_cache


@dataclass
class AttentionMetadata:
    """Where a flattened batch's tokens live: built by the model runner once per step.

    - ``slot_mapping`` ``[num_tokens]``: cache slot of each new token (-1: padding).
    - ``block_tables`` ``[num_seqs, max_blocks]`` int32: each sequence's blocks in order.
    - ``query_start_loc`` ``[num_seqs + 1]`` int32: offsets of each sequence's tokens.
    - ``seq_lens`` ``[num_seqs]`` int32: context length after this step's tokens.
    - ``max_query_len`` / ``max_seq_len``: host-side bounds (no device sync needed).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    max_query_len: int
    max_seq_len: int


class Attention(nn.Module):
    """Paged multi-head attention (MHA, GQA or MQA, decided by the head counts)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 sliding_window: int | None = None, softcap: float | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        # The layer sees only the last ``sliding_window`` tokens (None: all of them).
        self.sliding_window = sliding_window
        # Gemma 2's tanh soft-capping of attention scores (None: plain scores).
        self.softcap = softcap
        # [2, num_blocks, block_size, num_kv_heads, head_dim], bound by the model runner.
        self.kv_cache: torch.Tensor | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        if self.kv_cache is None:
            raise RuntimeError("the KV cache is not bound; the model runner binds it")
        num_tokens = q.shape[0]
        key_cache, value_cache = self.kv_cache[0], self.kv_cache[1]
        store_kv_cache(
            k.view(num_tokens, self.num_kv_heads, self.head_dim),
            v.view(num_tokens, self.num_kv_heads, self.head_dim),
            key_cache,
            value_cache,
            meta.slot_mapping,
        )
        out = paged_attention(
            q.view(num_tokens, self.num_heads, self.head_dim),
            key_cache,
            value_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            self.scale,
            max_query_len=meta.max_query_len,
            max_seq_len=meta.max_seq_len,
            sliding_window=self.sliding_window,
            softcap=self.softcap,
        )
        return out.view(num_tokens, self.num_heads * self.head_dim)
