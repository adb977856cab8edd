"""Per-sequence penalty state kept on the device and updated by each step's new tokens.

The repetition penalty needs, per row, which tokens the sequence has seen (prompt and
output); the presence and frequency penalties need how often each token appeared in the
output. Rebuilding both from every token every step costs host time and a copy in
proportion to the whole context (about 25 ms and 8 MiB at 128 sequences of 4k tokens).
Here each sequence owns one row of two ``[capacity, vocab]`` tables from the first step
it samples with a penalty until it finishes; a step scatters only the tokens added since
the sequence's last step (its prompt once, then one token per step) and gathers the
batch's rows. Row 0 stays all zero: rows of the batch that use no penalty point there.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
import torch

from kvrelay_worker.engine.sequence import Sequence
from kvrelay_worker.engine.transfer import host_to_device

_INITIAL_ROWS = 16


@dataclass
class _Slot:
    seq: Sequence
    row: int
    synced: int = 0  # tokens of seq.token_ids already in the tables


class PenaltyState:
    """Seen-token masks and output-token counts, one table row per live sequence."""

    def __init__(self, vocab_size: int, device: torch.device,
                 initial_rows: int = _INITIAL_ROWS) -> None:
        self.vocab_size = vocab_size
        self.device = device
        rows = max(2, initial_rows)
        self.seen = torch.zeros((rows, vocab_size), dtype=torch.bool, device=device)
        self.counts = torch.zeros((rows, vocab_size), dtype=torch.float32, device=device)
        self._slots: dict[int, _Slot] = {}
        self._free = list(range(rows - 1, 0, -1))  # row 0 is the blank row

    @property
    def num_tracked(self) -> int:
        return len(self._slots)

    def release_finished(self) -> None:
        """Give back the rows of sequences that have finished (or were aborted)."""
        done = [seq_id for seq_id, slot in self._slots.items() if slot.seq.is_finished]
        for seq_id in done:
            row = self._slots.pop(seq_id).row
            self.seen[row] = False
            self.counts[row] = 0.0
            self._free.append(row)

    def rows_for(self, seqs: Seq[Sequence], tracked: Seq[bool]) -> list[int]:
        """Bring the tracked sequences' rows up to date; return each sequence's table row.

        Untracked sequences get row 0 (no seen token, no count).
        """
        rows: list[int] = []
        seen_rows: list[np.ndarray] = []
        seen_ids: list[np.ndarray] = []
        count_rows: list[np.ndarray] = []
        count_ids: list[np.ndarray] = []
        for seq, track in zip(seqs, tracked, strict=True):
            if not track:
                rows.append(0)
                continue
            slot = self._slots.get(seq.seq_id)
            if slot is None:
                slot = self._slots[seq.seq_id] = _Slot(seq, self._take_row())
            rows.append(slot.row)
            if slot.synced == seq.num_tokens:
                continue
            new = np.asarray(seq.token_ids[slot.synced:], dtype=np.int64)
            seen_rows.append(np.full(new.shape, slot.row, dtype=np.int64))
            seen_ids.append(new)
            outputs = new[max(0, seq.num_prompt_tokens - slot.synced):]
            count_rows.append(np.full(outputs.shape, slot.row, dtype=np.int64))
            count_ids.append(outputs)
            slot.synced = seq.num_tokens
        if seen_ids:
            row_t, ids_t = self._pairs(seen_rows, seen_ids)
            self.seen[row_t, ids_t] = True
        if count_ids:
            row_t, ids_t = self._pairs(count_rows, count_ids)
            ones = torch.ones(ids_t.shape, dtype=torch.float32, device=self.device)
            self.counts.index_put_((row_t, ids_t), ones, accumulate=True)
        return rows

    def _pairs(self, rows: list[np.ndarray], ids: list[np.ndarray]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        return (host_to_device(torch.from_numpy(np.concatenate(rows)), self.device),
                host_to_device(torch.from_numpy(np.concatenate(ids)), self.device))

    def _take_row(self) -> int:
        if not self._free:
            old = self.seen.shape[0]
            self.seen = torch.cat((self.seen, torch.zeros_like(self.seen)))
            self.counts = torch.cat((self.counts, torch.zeros_like(self.counts)))
            self._free = list(range(2 * old - 1, old - 1, -1))
        return self._free.pop()
