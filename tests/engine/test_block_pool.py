"""The block pool: LRU free queue, reference counts, the prefix-cache map.

A hypothesis state machine drives a ``BlockPool`` with random take / touch / publish /
free operations and compares it after every one with a plain-Python model of what the
pool promises (free queue order, ref counts, which block caches which hash). Example
tests pin the behaviours the scheduler relies on: LRU eviction, tail-first freeing, a
prefix hit pulling a free block out of the queue, eviction forgetting the block's hash.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvrelay_worker.engine.kv.block_pool import BlockPool, FreeBlockQueue, KVBlock
from kvrelay_worker.engine.kv.kv_cache import KVCacheManager, root_hash
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.sched.sequence import Sequence

BLOCK_SIZE = 4
HASHES = [bytes([i]) * 16 for i in range(6)]


def ids(blocks: Iterable[KVBlock]) -> list[int]:
    return [b.block_id for b in blocks]


def make_seq(tokens: list[int], salt: str | None = None) -> Sequence:
    return Sequence(request_id="r", choice_index=0, token_ids=list(tokens),
                    num_prompt_tokens=len(tokens), params=SamplingParams(), cache_salt=salt)


# ------------------------------------------------------------------ state machine


class BlockPoolMachine(RuleBasedStateMachine):
    """The pool against a reference: a list for the free queue, dicts for the rest."""

    NUM_BLOCKS = 6

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(self.NUM_BLOCKS)
        self.free_order = list(range(self.NUM_BLOCKS))
        self.ref = [0] * self.NUM_BLOCKS
        self.hash_of: list[bytes | None] = [None] * self.NUM_BLOCKS
        self.cached: dict[bytes, int] = {}
        self.evictions = 0
        # One entry per reference we hold (a block id may appear several times).
        self.held: list[int] = []

    @rule(count=st.integers(0, 4))
    def take(self, count: int) -> None:
        if count > len(self.free_order):
            with pytest.raises(ValueError, match="free"):
                self.pool.get_new_blocks(count)
            return
        expected = self.free_order[:count]
        got = self.pool.get_new_blocks(count)
        assert ids(got) == expected, "new blocks must come from the head of the free queue"
        for block_id in expected:
            self.free_order.remove(block_id)
            old = self.hash_of[block_id]
            if old is not None:
                self.evictions += 1
                if self.cached.get(old) == block_id:
                    del self.cached[old]
                self.hash_of[block_id] = None
            self.ref[block_id] = 1
            self.held.append(block_id)

    @rule(h=st.sampled_from(HASHES))
    def touch(self, h: bytes) -> None:
        found = self.pool.get_cached_block(h)
        expected = self.cached.get(h)
        assert (found.block_id if found else None) == expected
        if found is None:
            return
        self.pool.touch([found])
        if self.ref[found.block_id] == 0:
            self.free_order.remove(found.block_id)
        self.ref[found.block_id] += 1
        self.held.append(found.block_id)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), h=st.sampled_from(HASHES))
    def publish(self, data: st.DataObject, h: bytes) -> None:
        block_id = data.draw(st.sampled_from(self.held))
        self.pool.cache_block(self.pool.blocks[block_id], h)
        if self.hash_of[block_id] is None and h not in self.cached:
            self.hash_of[block_id] = h
            self.cached[h] = block_id

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        picks = data.draw(st.lists(st.integers(0, len(self.held) - 1), min_size=1,
                                   max_size=len(self.held), unique=True))
        to_free = [self.held[i] for i in picks]
        for i in sorted(picks, reverse=True):
            del self.held[i]
        self.pool.free(self.pool.blocks[b] for b in to_free)
        for block_id in to_free:
            self.ref[block_id] -= 1
            if self.ref[block_id] == 0:
                self.free_order.append(block_id)

    @precondition(lambda self: any(r == 0 for r in self.ref))
    @rule(data=st.data())
    def double_free_is_refused(self, data: st.DataObject) -> None:
        block_id = data.draw(st.sampled_from([i for i, r in enumerate(self.ref) if r == 0]))
        with pytest.raises(ValueError, match="double free"):
            self.pool.free([self.pool.blocks[block_id]])

    @invariant()
    def matches_reference(self) -> None:
        pool = self.pool
        assert ids(pool.free_queue) == self.free_order
        assert pool.num_free_blocks == len(self.free_order)
        assert [b.ref_cnt for b in pool.blocks] == self.ref
        assert all(r >= 0 for r in self.ref)
        assert [b.block_hash for b in pool.blocks] == self.hash_of
        assert {h: b.block_id for h, b in pool.cached.items()} == self.cached
        assert pool.num_evictions == self.evictions
        for block in pool.blocks:
            assert (block in pool.free_queue) == (block.ref_cnt == 0)


TestBlockPoolMachine = BlockPoolMachine.TestCase
TestBlockPoolMachine.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# ------------------------------------------------------------------ free queue


def test_free_queue_is_fifo_with_removal_from_the_middle() -> None:
    blocks = [KVBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    assert ids(queue) == [0, 1, 2, 3, 4]
    queue.remove(blocks[2])
    assert blocks[2] not in queue
    assert ids(queue) == [0, 1, 3, 4]
    queue.append(blocks[2])
    assert queue.popleft() is blocks[0]
    assert ids(queue) == [1, 3, 4, 2]
    assert queue.num_free == 4
    for _ in range(4):
        queue.popleft()
    with pytest.raises(IndexError):
        queue.popleft()
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(blocks[0])


def test_pool_needs_a_block() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(0)


def test_asking_for_too_many_blocks_takes_none() -> None:
    pool = BlockPool(3)
    with pytest.raises(ValueError, match="asked for 4 blocks, only 3 free"):
        pool.get_new_blocks(4)
    assert pool.num_free_blocks == 3
    assert all(b.ref_cnt == 0 for b in pool.blocks)


# ------------------------------------------------------------------ LRU eviction


def test_blocks_freed_earlier_are_reused_earlier() -> None:
    pool = BlockPool(4)
    a, b, c, d = pool.get_new_blocks(4)
    pool.free([c])
    pool.free([a])
    pool.free([d])
    pool.free([b])
    assert ids(pool.get_new_blocks(4)) == [c.block_id, a.block_id, d.block_id, b.block_id]


def test_a_sequence_frees_its_blocks_tail_first() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE, enable_caching=True,
                        model_id="m")
    seq = make_seq(list(range(100, 111)))  # 11 tokens: 3 blocks
    assert kv.allocate_slots(seq, seq.num_tokens)
    table = list(seq.block_table)
    assert len(table) == 3
    untouched = [b.block_id for b in kv.pool.free_queue]
    kv.free(seq)
    assert list(seq.block_table) == []
    # Freed blocks join the tail, last block first: the prefix is evicted last.
    assert ids(kv.pool.free_queue) == [*untouched, *reversed(table)]
    taken = kv.pool.get_new_blocks(len(untouched) + 1)
    assert ids(taken)[-1] == table[-1]


def test_evicting_the_tail_keeps_the_shared_prefix_cached() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE, enable_caching=True,
                        model_id="m")
    prompt = list(range(100, 113))  # 13 tokens: 3 full blocks and one partial
    seq = make_seq(prompt)
    assert kv.allocate_slots(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    kv.publish_computed_blocks(seq)
    kv.free(seq)
    # Two new blocks evict the sequence's last (partial, uncached) block, then its third
    # block; the first two stay cached.
    kv.pool.get_new_blocks(2)
    again = make_seq(prompt)
    assert len(kv.find_cached_prefix(again)) == 2


# ------------------------------------------------------------------ prefix cache


def test_prefix_hit_on_a_free_block_takes_it_out_of_the_free_queue() -> None:
    kv = KVCacheManager(num_blocks=6, block_size=BLOCK_SIZE, enable_caching=True,
                        model_id="m")
    prompt = list(range(200, 210))  # 2 full blocks + 2 tokens
    first = make_seq(prompt)
    assert kv.allocate_slots(first, first.num_tokens)
    first.num_computed_tokens = first.num_tokens
    kv.publish_computed_blocks(first)
    shared = [kv.pool.blocks[i] for i in first.block_table[:2]]
    kv.free(first)
    assert all(b in kv.pool.free_queue and b.ref_cnt == 0 for b in shared)
    assert kv.num_free_blocks == 6

    second = make_seq(prompt)
    hits = kv.find_cached_prefix(second)
    assert hits == shared
    assert kv.allocate_slots(second, second.num_tokens - 8, hits)
    assert second.num_computed_tokens == 0  # counting them is the scheduler's job
    assert list(second.block_table[:2]) == ids(shared)
    for block in shared:
        assert block not in kv.pool.free_queue
        assert block.ref_cnt == 1
    # 2 reclaimed from the queue, 1 new block for the last 2 tokens.
    assert kv.num_free_blocks == 3


def test_evicting_a_cached_block_forgets_its_hash() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=BLOCK_SIZE, enable_caching=True,
                        model_id="m")
    prompt = list(range(300, 305))
    seq = make_seq(prompt)
    assert kv.allocate_slots(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    kv.publish_computed_blocks(seq)
    block = kv.pool.blocks[seq.block_table[0]]
    block_hash = block.block_hash
    assert block_hash is not None
    assert kv.pool.cached[block_hash] is block
    kv.free(seq)
    kv.pool.get_new_blocks(2)  # evicts both
    assert block.block_hash is None
    assert block_hash not in kv.pool.cached
    assert kv.pool.num_evictions == 1
    assert kv.find_cached_prefix(make_seq(prompt)) == []


def test_duplicate_content_keeps_the_first_cached_block() -> None:
    pool = BlockPool(2)
    a, b = pool.get_new_blocks(2)
    pool.cache_block(a, HASHES[0])
    pool.cache_block(b, HASHES[0])
    assert pool.cached[HASHES[0]] is a
    assert b.block_hash is None
    pool.cache_block(a, HASHES[1])  # already caches something: unchanged
    assert a.block_hash == HASHES[0]
    assert HASHES[1] not in pool.cached


def test_caching_off_caches_nothing() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE, enable_caching=False,
                        model_id="m")
    seq = make_seq(list(range(9)))
    assert kv.allocate_slots(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    kv.publish_computed_blocks(seq)
    assert kv.pool.cached == {}
    assert seq.block_hashes == []
    kv.free(seq)
    assert kv.find_cached_prefix(make_seq(list(range(9)))) == []


def test_reset_prefix_cache_forgets_everything() -> None:
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(3)
    for block, h in zip(blocks, HASHES, strict=False):
        pool.cache_block(block, h)
    pool.reset_prefix_cache()
    assert pool.cached == {}
    assert all(b.block_hash is None for b in pool.blocks)
    assert all(b.ref_cnt == 1 for b in blocks)


def test_at_least_one_token_is_left_to_compute() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE, enable_caching=True,
                        model_id="m")
    prompt = list(range(8))  # exactly 2 full blocks
    seq = make_seq(prompt)
    assert kv.allocate_slots(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    kv.publish_computed_blocks(seq)
    assert len(kv.pool.cached) == 2
    # The same prompt again may reuse only the first block: the last token must run.
    assert len(kv.find_cached_prefix(make_seq(prompt))) == 1


def test_salt_and_model_separate_the_hash_chains() -> None:
    assert root_hash("m", None) != root_hash("m", "a")
    assert root_hash("m", "a") != root_hash("m", "b")
    assert root_hash("m", None) != root_hash("n", None)
    assert root_hash("m", "") != root_hash("m", None)
    kv = KVCacheManager(num_blocks=6, block_size=BLOCK_SIZE, enable_caching=True,
                        model_id="m")
    prompt = list(range(9))
    seq = make_seq(prompt, salt="tenant-a")
    assert kv.allocate_slots(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    kv.publish_computed_blocks(seq)
    assert len(kv.find_cached_prefix(make_seq(prompt, salt="tenant-a"))) == 2
    assert kv.find_cached_prefix(make_seq(prompt, salt="tenant-b")) == []
    assert kv.find_cached_prefix(make_seq(prompt)) == []


def test_failed_allocation_changes_nothing() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE, enable_caching=True,
                        model_id="m")
    prompt = list(range(9))  # 2 full blocks + 1 token
    first = make_seq(prompt)
    assert kv.allocate_slots(first, first.num_tokens)
    first.num_computed_tokens = first.num_tokens
    kv.publish_computed_blocks(first)
    kv.free(first)
    queue_before = ids(kv.pool.free_queue)

    # Hits on 2 free cached blocks, plus 3 more blocks for 12 new tokens: the 2 hits
    # leave the queue, so only 2 blocks remain for the 3 needed.
    longer = make_seq(prompt + list(range(100, 111)))
    hits = kv.find_cached_prefix(longer)
    assert len(hits) == 2
    assert not kv.allocate_slots(longer, longer.num_tokens - 8, hits)
    assert ids(kv.pool.free_queue) == queue_before
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks)
    assert list(longer.block_table) == []
    assert longer.num_computed_tokens == 0
    assert kv.num_blocks_held(longer) == 0
    # One fewer token fits exactly (2 hits + 2 new blocks).
    assert kv.allocate_slots(longer, longer.num_tokens - 8 - 4, hits)
    assert kv.num_free_blocks == 0
