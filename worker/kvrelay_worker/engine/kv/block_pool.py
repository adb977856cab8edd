"""The pool of KV-cache blocks: reference counts, an LRU free queue, the prefix-cache map.

A block with ``ref_cnt == 0`` sits in the free queue but may still hold a cached prefix
(its ``block_hash`` is set). Handing out a new block takes the queue's head (the least
recently freed), evicting whatever prefix it cached; a prefix-cache hit on a free block
pulls it out of the queue instead. Sequences free their blocks tail first, so the end of
a sequence is evicted before its (more shareable) beginning.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class KVBlock:
    """One fixed-size block of KV slots, and its place in the free queue."""

    __slots__ = ("block_hash", "block_id", "next_free", "prev_free", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None

    def __repr__(self) -> str:
        return f"KVBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Doubly linked list of free blocks with O(1) pop-front, append and removal."""

    def __init__(self, blocks: Iterable[KVBlock]) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVBlock:
        block = self._head.next_free
        if block is None or block is self._tail:
            raise IndexError("no free blocks")
        self.remove(block)
        return block

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free += 1

    def remove(self, block: KVBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"{block} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def __iter__(self) -> Iterator[KVBlock]:
        block = self._head.next_free
        while block is not None and block is not self._tail:
            yield block
            block = block.next_free

    def __contains__(self, block: KVBlock) -> bool:
        return block.prev_free is not None


class BlockPool:
    """Owns every block; the only place ``ref_cnt`` and the prefix-cache map change."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("a block pool needs at least one block")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[bytes, KVBlock] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    def get_cached_block(self, block_hash: bytes) -> KVBlock | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def get_new_blocks(self, count: int) -> list[KVBlock]:
        """Take ``count`` blocks from the head of the free queue (ref_cnt becomes 1)."""
        if count > self.num_free_blocks:
            raise ValueError(f"asked for {count} blocks, only {self.num_free_blocks} free")
        taken = []
        for _ in range(count):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            taken.append(block)
        return taken

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on blocks found in the prefix cache."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block; blocks reaching zero join the queue's tail.

        Pass a sequence's blocks last-first so its tail is evicted before its prefix.
        """
        for block in blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"double free of {block}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache_block(self, block: KVBlock, block_hash: bytes) -> None:
        """Publish a full, computed block under its chained hash."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached:
            # Another block already caches this content; keep the first one.
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None
            self.num_evictions += 1

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks in use keep their data)."""
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
