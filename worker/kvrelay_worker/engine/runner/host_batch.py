"""A step's batch flattened on the host: what the model runner builds and both decode paths read.

Its own module so that the model runner and the CUDA-graph decode runner can both use it
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class HostBatch:
    """A flattened batch on the host (CPU tensors), before it goes to the device."""

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    slot_mapping: torch.Tensor  # [num_tokens] int64
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    logits_indices: torch.Tensor  # [num_sampling] int64
    max_query_len: int
    max_seq_len: int
    # Per token, its sequence's LoRA adapter slot (-1: none) [num_tokens] int64; None
    # when no row of the step has an adapter (``models/lora_linear.py``).
    lora_slots: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
