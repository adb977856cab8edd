"""Which host blocks hold which swapped-out sequence.

The host blocks come from a second ``BlockPool`` with prefix caching off: the same
reference counts, free queue and double-free check as the device pool, rather than a
second allocator to get wrong. A host block belongs to exactly one swapped sequence and
is read back only by that sequence's swap-in, so it is never shared or cached.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvrelay_worker.engine.kv.block_pool import BlockPool, KVBlock
from kvrelay_worker.engine.sched.sequence import Sequence


@dataclass
class SwappedBlocks:
    """A swapped sequence's live blocks, in block-table order, and what precedes them.

    ``num_released`` leading block-table entries were behind the sliding window and held
    no block when the sequence was swapped out; they come back as ``RELEASED_BLOCK``.
    """

    host_blocks: list[KVBlock]
    num_released: int

    @property
    def host_ids(self) -> list[int]:
        return [b.block_id for b in self.host_blocks]


class SwapSpace:
    """The host pool's bookkeeping: blocks free, and the blocks of each swapped sequence."""

    def __init__(self, num_blocks: int) -> None:
        self.pool = BlockPool(num_blocks, enable_caching=False)
        self._swapped: dict[int, SwappedBlocks] = {}

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_swapped(self) -> int:
        return len(self._swapped)

    def can_hold(self, num_blocks: int) -> bool:
        return num_blocks <= self.pool.num_free_blocks

    def holds(self, seq: Sequence) -> bool:
        return seq.seq_id in self._swapped

    def get(self, seq: Sequence) -> SwappedBlocks:
        return self._swapped[seq.seq_id]

    def store(self, seq: Sequence, num_blocks: int, num_released: int) -> list[int]:
        """Take host blocks for ``seq``'s live blocks; return their ids, in order."""
        if seq.seq_id in self._swapped:
            raise ValueError(f"sequence {seq.seq_id} is already swapped out")
        record = SwappedBlocks(self.pool.get_new_blocks(num_blocks), num_released)
        self._swapped[seq.seq_id] = record
        return record.host_ids

    def free(self, seq: Sequence) -> SwappedBlocks | None:
        """Give back ``seq``'s host blocks (swapped in, finished or aborted), if it has any.

        After a swap-in the blocks are still to be read by the copy queued this step; only
        a later swap-out's copy can overwrite them, and it is queued behind.
        """
        record = self._swapped.pop(seq.seq_id, None)
        if record is not None:
            self.pool.free(reversed(record.host_blocks))
        return record
