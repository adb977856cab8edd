"""Per-sequence penalty state kept on the device and updated by each step's new tokens.

The repetition penalty needs, per row, which tokens the sequence has seen (prompt and
output); the presence and frequency penalties need how often each token appeared in the
output. Rebuilding both from every token every step costs host time and a copy in
proportion to the whole context, which grows with every sequence and every token.
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

from kvrelay_worker.engine.runner.transfer import host_to_device
from kvrelay_worker.engine.sched.sequence import Sequence

_INITIAL_ROWS = 16


@dataclass
class _Slot:
    seq: Sequence
    row: int
    synced: int = 0  # tokens of seq.token_ids already in the tables


class _Pairs:
    """(table row, token id) pairs to scatter. A decode step adds one token per sequence,
    kept in plain lists (cheaper than small arrays); a prompt adds thousands, kept as one
    numpy array each (cheaper than list items)."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.ids: list[int] = []
        self.chunks: list[tuple[int, np.ndarray]] = []

    def __bool__(self) -> bool:
        return bool(self.ids or self.chunks)

    def add(self, row: int, ids: list[int]) -> None:
        if len(ids) == 1:
            self.rows.append(row)
            self.ids.append(ids[0])
        elif ids:
            self.chunks.append((row, np.asarray(ids, dtype=np.int64)))

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.concatenate([np.asarray(self.rows, dtype=np.int64),
                               *(np.full(ids.shape, row, dtype=np.int64)
                                 for row, ids in self.chunks)])
        ids = np.concatenate([np.asarray(self.ids, dtype=np.int64),
                              *(ids for _, ids in self.chunks)])
        return (host_to_device(torch.from_numpy(rows), device),
                host_to_device(torch.from_numpy(ids), device))


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
        seen, counts = _Pairs(), _Pairs()
        # Marked synced only once the scatters ran: a step that fails here is retried
        # (engine failure isolation), and its other sequences must scatter again.
        synced: list[tuple[_Slot, int]] = []
        for seq, track in zip(seqs, tracked, strict=True):
            if not track:
                rows.append(0)
                continue
            slot = self._slots.get(seq.seq_id)
            if slot is None:
                slot = self._slots[seq.seq_id] = _Slot(seq, self._take_row())
            rows.append(slot.row)
            total = seq.num_tokens
            if slot.synced == total:
                continue
            new = seq.token_ids[slot.synced:]
            seen.add(slot.row, new)
            counts.add(slot.row, new[max(0, seq.num_prompt_tokens - slot.synced):])
            synced.append((slot, total))
        if seen:
            row_ids, token_ids = seen.tensors(self.device)
            self.seen[row_ids, token_ids] = True
        if counts:
            row_ids, token_ids = counts.tensors(self.device)
            ones = torch.ones(token_ids.shape, dtype=torch.float32, device=self.device)
            self.counts.index_put_((row_ids, token_ids), ones, accumulate=True)
        for slot, total in synced:
            slot.synced = total
        return rows

    def _take_row(self) -> int:
        if not self._free:
            old = self.seen.shape[0]
            self.seen = torch.cat((self.seen, torch.zeros_like(self.seen)))
            self.counts = torch.cat((self.counts, torch.zeros_like(self.counts)))
            self._free = list(range(2 * old - 1, old - 1, -1))
        return self._free.pop()
