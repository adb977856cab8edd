"""Prompt blocks that running prefills are about to compute, so that a prompt sharing
them waits for the prefix cache instead of computing them a second time.

Each full block is offered to the prefix cache as soon as it is computed, so a prompt
admitted after another with the same prefix hits the blocks already done. Prompts that
arrive together, though (a burst of requests over one long system prompt, the first
turns of many conversations), are admitted together and each computes the whole shared
prefix. A waiting prompt whose first uncached block is one a running prefill will compute
is held back instead, and admitted once that block is cached: the shared part is computed
once. It only waits while another sequence is making that very block, so it starts about
when its prefill would have reached the end of the shared part anyway, with that much
less work for the batch.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvrelay_worker.engine.kv.kv_cache import KVCacheManager
from kvrelay_worker.engine.sched.sequence import Sequence


class PrefillsInFlight:
    """The hashes of the full blocks running sequences have yet to prefill."""

    def __init__(self, kv: KVCacheManager, running: Iterable[Sequence]) -> None:
        self.kv = kv
        self._hashes: set[bytes] = set()
        for seq in running:
            self.add(seq)

    def add(self, seq: Sequence) -> None:
        """Count the full blocks ``seq`` still has to prefill (none once it decodes)."""
        if not self.kv.enable_caching or seq.num_tokens - seq.num_computed_tokens <= 1:
            return
        self.kv.update_block_hashes(seq)
        size = self.kv.block_size
        self._hashes.update(seq.block_hashes[seq.num_computed_tokens // size:
                                             seq.num_tokens // size])

    def holds_next_block(self, seq: Sequence, num_cached_blocks: int) -> bool:
        """True when the block after ``seq``'s cached prefix is being prefilled by another
        sequence (so waiting a step or more turns it into a cache hit)."""
        if not self.kv.enable_caching or not self._hashes:
            return False
        limit = (seq.num_tokens - 1) // self.kv.block_size  # as ``find_cached_prefix``
        return (num_cached_blocks < min(limit, len(seq.block_hashes))
                and seq.block_hashes[num_cached_blocks] in self._hashes)
