"""Per-sequence KV-cache bookkeeping on top of the ``BlockPool``.

Answers the scheduler's two questions: how much of this sequence is already in the
prefix cache, and is there room for its next tokens (allocating the blocks if so).
Block identity for the prefix cache is a chained hash: each full block's hash covers the
model, the request's cache salt and LoRA adapter, every earlier token and its own tokens,
so equal hashes mean equal KV content.

With a sliding window on every layer, a block whose tokens all lie before the window of
the next token to compute is never read again: it goes back to the pool (still in the
prefix cache if published, so a later request with the same prefix can take it), and its
block-table entry points at ``RELEASED_BLOCK``, which the attention kernels never read
because it is outside every window. A long sequence then holds O(window) blocks.

Swap preemption detaches a sequence's live blocks (the engine copies them to host memory
before the next forward pass) and later attaches fresh blocks for the copy to come back
into; the sequence keeps its computed tokens and block hashes in between.

Beam search forks a sequence by sharing its blocks (``share_blocks``: one more reference
each). A block that two sequences hold is never written: when a sequence is about to
write into a shared block (the partial last one of a fork), ``allocate_slots`` gives it
a fresh block and queues a device copy of the shared one (``take_copies``), which the
engine makes before the forward pass (copy-on-write).
"""

from __future__ import annotations

import hashlib
from array import array

from kvrelay_worker.engine.kv.block_pool import BlockPool, KVBlock
from kvrelay_worker.engine.sched.sequence import Sequence


def root_hash(model_id: str, cache_salt: str | None, adapter: str | None = None) -> bytes:
    """The chain's starting point: different models, salts or LoRA adapters (``adapter``:
    the adapter's content key) never share blocks."""
    salt = b"" if cache_salt is None else b"\x01" + cache_salt.encode()
    root = hashlib.sha256(b"kvrelay-block\x00" + model_id.encode() + b"\x00" + salt).digest()
    if adapter is None:
        return root
    # Hashed over the fixed-size root, so no salt can spell an adapter's chain.
    return hashlib.sha256(root + b"lora\x00" + adapter.encode()).digest()


def hash_block(parent: bytes, tokens: list[int]) -> bytes:
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()[:16]


# What a released block's block-table entry holds: any valid id does, since it is never read.
RELEASED_BLOCK = 0

# Stands in for released entries of a swapped-in sequence's block list: outside the pool,
# never freed, published or written (every use of the list skips the released prefix).
_RELEASED_PLACEHOLDER = KVBlock(RELEASED_BLOCK)


class KVCacheManager:
    """Allocates and frees each sequence's blocks; publishes full blocks to the cache."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool,
                 model_id: str, sliding_window: int | None = None) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.model_id = model_id
        self.sliding_window = sliding_window
        self.pool = BlockPool(num_blocks, enable_caching)
        self._blocks: dict[int, list[KVBlock]] = {}
        self._num_published: dict[int, int] = {}
        # Leading blocks already given back because they fell out of the window.
        self._num_released: dict[int, int] = {}
        self.num_released_blocks = 0
        # Copy-on-write copies (source block id, fresh block id) for the next forward pass.
        self._copies: list[tuple[int, int]] = []
        self.num_copies_on_write = 0

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def update_block_hashes(self, seq: Sequence) -> None:
        """Extend ``seq.block_hashes`` to cover every full block of its tokens."""
        if not self.enable_caching:
            return
        hashes = seq.block_hashes
        full = seq.num_tokens // self.block_size
        bs = self.block_size
        parent = hashes[-1] if hashes else root_hash(
            self.model_id, seq.cache_salt, None if seq.lora is None else seq.lora.cache_key)
        for i in range(len(hashes), full):
            parent = hash_block(parent, seq.token_ids[i * bs : (i + 1) * bs])
            hashes.append(parent)

    def find_cached_prefix(self, seq: Sequence) -> list[KVBlock]:
        """The longest run of leading full blocks already cached.

        Capped so at least one token is left to compute: the model must run on the last
        token to produce logits to sample from.
        """
        if not self.enable_caching:
            return []
        self.update_block_hashes(seq)
        limit = (seq.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for block_hash in seq.block_hashes[:limit]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       cached: list[KVBlock] | None = None) -> bool:
        """Make room for ``num_new_tokens`` more tokens after the computed (or cached) ones.

        ``cached`` are prefix-cache hits for a sequence being admitted; on success they
        join its block table (the scheduler counts them as computed). Returns False,
        changing nothing, when the pool cannot supply the blocks.
        """
        cached = cached or []
        blocks = self._blocks.setdefault(seq.seq_id, [])
        num_computed = seq.num_computed_tokens + len(cached) * self.block_size
        needed = self.blocks_for_tokens(num_computed + num_new_tokens) - len(blocks) - len(cached)
        # Cache hits that sit in the free queue stop being free once we take them.
        reclaimed = sum(1 for b in cached if b.ref_cnt == 0)
        shared = self._shared_to_write(blocks, num_computed) if not cached else []
        if needed + len(shared) > self.pool.num_free_blocks - reclaimed:
            if not blocks:
                del self._blocks[seq.seq_id]
            return False
        for i in shared:
            self._copy_on_write(seq, blocks, i)
        if cached:
            self.pool.touch(cached)
            blocks.extend(cached)
            seq.block_table.extend(b.block_id for b in cached)
            self._num_published[seq.seq_id] = len(blocks)
        if needed > 0:
            new = self.pool.get_new_blocks(needed)
            blocks.extend(new)
            seq.block_table.extend(b.block_id for b in new)
        return True

    def _shared_to_write(self, blocks: list[KVBlock], num_computed: int) -> list[int]:
        """Indexes of blocks another sequence also holds that the next tokens write into."""
        first = num_computed // self.block_size
        return [i for i in range(first, len(blocks)) if blocks[i].ref_cnt > 1]

    def _copy_on_write(self, seq: Sequence, blocks: list[KVBlock], index: int) -> None:
        old = blocks[index]
        (new,) = self.pool.get_new_blocks(1)
        self.pool.free([old])
        blocks[index] = new
        seq.block_table[index] = new.block_id
        self._copies.append((old.block_id, new.block_id))
        self.num_copies_on_write += 1

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write copies queued since the last call (source id, destination id)."""
        copies, self._copies = self._copies, []
        return copies

    def share_blocks(self, targets: list[Sequence], sources: list[Sequence]) -> None:
        """Give each target the blocks its source holds now (a beam fork), by reference.

        Sources may be targets too: every source's list is read before any target's is
        replaced. The caller sets the targets' tokens and computed counts to the sources'.
        """
        taken = [(list(self._blocks.get(src.seq_id, [])), self._num_published.get(src.seq_id, 0),
                  self._num_released.get(src.seq_id, 0)) for src in sources]
        for blocks, _, released in taken:
            self.pool.touch(blocks[released:])
        for target in targets:
            self.free(target)
        for target, (blocks, published, released) in zip(targets, taken, strict=True):
            self._blocks[target.seq_id] = blocks
            self._num_published[target.seq_id] = published
            if released:
                self._num_released[target.seq_id] = released
            target.block_table.extend(RELEASED_BLOCK if i < released else b.block_id
                                      for i, b in enumerate(blocks))

    def publish_computed_blocks(self, seq: Sequence) -> None:
        """Offer every newly completed, computed full block to the prefix cache."""
        if not self.enable_caching:
            return
        blocks = self._blocks.get(seq.seq_id)
        if not blocks:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(blocks))
        start = self._num_published.get(seq.seq_id, 0)
        if full <= start:
            return
        self.update_block_hashes(seq)
        for i in range(start, full):
            self.pool.cache_block(blocks[i], seq.block_hashes[i])
        self._num_published[seq.seq_id] = full

    def release_out_of_window(self, seq: Sequence) -> None:
        """Give back the leading blocks no future token's window reaches.

        The next token computed sits at position ``num_computed_tokens`` and sees positions
        from ``num_computed_tokens - window + 1`` on; every block ending before that is
        done. Call after ``publish_computed_blocks`` so released blocks stay cached.
        """
        if self.sliding_window is None:
            return
        blocks = self._blocks.get(seq.seq_id)
        if not blocks:
            return
        first_needed = max(0, seq.num_computed_tokens - self.sliding_window + 1)
        done = min(first_needed // self.block_size, len(blocks))
        start = self._num_released.get(seq.seq_id, 0)
        if done <= start:
            return
        # Released last-first, like ``free``: the later block is evicted first.
        self.pool.free(reversed(blocks[start:done]))
        for i in range(start, done):
            seq.block_table[i] = RELEASED_BLOCK
        self._num_released[seq.seq_id] = done
        self.num_released_blocks += done - start

    def free(self, seq: Sequence) -> None:
        """Release a sequence's blocks, last block first, and clear its block table."""
        blocks = self._blocks.pop(seq.seq_id, [])
        self._num_published.pop(seq.seq_id, None)
        released = self._num_released.pop(seq.seq_id, 0)
        if self._copies:  # a copy into a block given back now would land on its next owner
            gone = {b.block_id for b in blocks[released:] if b.ref_cnt == 1}
            self._copies = [c for c in self._copies if c[1] not in gone]
        self.pool.free(reversed(blocks[released:]))
        del seq.block_table[:]

    def free_blocks_after(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks past the first ``num_tokens`` slots (rejected drafts' room).

        Such blocks hold no computed token, so none is cached or shared with a prefix.
        """
        blocks = self._blocks.get(seq.seq_id)
        keep = self.blocks_for_tokens(num_tokens)
        if not blocks or len(blocks) <= keep:
            return
        tail = blocks[keep:]
        del blocks[keep:]
        del seq.block_table[keep:]
        self.pool.free(reversed(tail))

    # ------------------------------------------------------------------------ swap

    def detach_for_swap(self, seq: Sequence) -> tuple[list[int], int]:
        """Free ``seq``'s blocks for a swap-out; return its live block ids and released count.

        The caller copies the live blocks out before any later forward pass can write
        them. They return to the pool as on a recompute preemption, published ones still
        in the prefix cache; ``num_computed_tokens`` and the block hashes are kept.
        """
        released = self._num_released.get(seq.seq_id, 0)
        live = [b.block_id for b in self._blocks.get(seq.seq_id, [])[released:]]
        self.free(seq)
        return live, released

    def blocks_to_resume(self, seq: Sequence, num_live: int, num_released: int,
                         num_new_tokens: int) -> int:
        """Free blocks a swap-in needs: the live blocks plus room for the next tokens."""
        total = self.blocks_for_tokens(seq.num_computed_tokens + num_new_tokens)
        return max(num_live, total - num_released)

    def attach_swapped(self, seq: Sequence, num_live: int, num_released: int) -> list[int]:
        """Fresh blocks for a swapped-in sequence's live entries; returns their ids.

        Released entries come back as ``RELEASED_BLOCK``. The copies' full computed blocks
        are offered to the prefix cache again (a hash another block still caches is kept
        there, so nothing is published twice); the copy lands before any forward pass
        that could read them.
        """
        if seq.seq_id in self._blocks:
            raise ValueError(f"sequence {seq.seq_id} already holds blocks")
        new = self.pool.get_new_blocks(num_live)
        self._blocks[seq.seq_id] = [_RELEASED_PLACEHOLDER] * num_released + new
        seq.block_table.extend([RELEASED_BLOCK] * num_released)
        seq.block_table.extend(b.block_id for b in new)
        if num_released:
            self._num_released[seq.seq_id] = num_released
        self._num_published[seq.seq_id] = num_released
        self.publish_computed_blocks(seq)
        return [b.block_id for b in new]

    def num_prefix_blocks_kept(self, seq: Sequence) -> int:
        """Leading cached blocks of ``seq`` that would survive its preemption.

        Only those another sequence also holds: the victim's own freed blocks are the
        ones the pressure that forced the preemption hands out next, so a recompute
        estimate counts them as lost. Capped like ``find_cached_prefix``.
        """
        if not self.enable_caching:
            return 0
        blocks = self._blocks.get(seq.seq_id, [])
        released = self._num_released.get(seq.seq_id, 0)
        limit = min(self._num_published.get(seq.seq_id, 0), (seq.num_tokens - 1) // self.block_size)
        kept = 0
        for i in range(limit):
            block = self.pool.get_cached_block(seq.block_hashes[i])
            own = 1 if i >= released and i < len(blocks) and blocks[i] is block else 0
            if block is None or block.ref_cnt - own <= 0:
                break
            kept += 1
        return kept

    def num_released(self, seq: Sequence) -> int:
        """How many leading block-table entries were given back (behind the window)."""
        return self._num_released.get(seq.seq_id, 0)

    def num_blocks_held(self, seq: Sequence) -> int:
        return len(self._blocks.get(seq.seq_id, ())) - self._num_released.get(seq.seq_id, 0)
