"""Property tests: the real Scheduler + KVCacheManager + BlockPool under random traffic.

A hypothesis state machine adds requests (prompts built from a few shared prefixes, so
prefix hits are frequent; some with several choices, some salted), steps and aborts. The
model is simulated: each step writes, for every scheduled token, the identity of the
token's context (salt and every token up to it) into a fake KV cache at the slot the
block table names, after checking that every context slot the model would read holds
exactly the right identity. A wrong prefix hit, a block handed to two writers or a block
table that misses a token therefore shows up as a wrong identity. Sampling appends a
random token through the scheduler's ``update_from_output``; sequences finish at random
(a stop string, as a stand-in detokenizer tells them), at ``max_tokens`` or at
``max_model_len``.

Checked after every operation: reference counts equal the number of sequences holding
each block and are never negative; a block is free exactly when nobody holds it; a block
held by two sequences is a cached, full, computed block at the same position of both;
running block tables cover the computed tokens; waiting sequences hold nothing; the step
respects the token budget and the sequence limit and admits by priority; a step's
preemption victims rank below every sequence left running (lowest priority, then newest,
whether or not already batched); when nothing is left, every block is free. With a sliding window (some runs draw one), only the window's
context is read, the released leading entries are exactly those behind it, and they are
held by nobody through that table. At the end every request is driven to completion in a
bounded number of steps (nothing livelocks) and no block leaks.

Each run draws a preemption mode (recompute, swap or auto with a drawn cost model) and a
small host pool. The scheduler's swap-out and swap-in block pairs move the identities
between the fake device cache and a fake host cache exactly as the engine's copies do
(swap-outs first, before the step writes anything), so a wrong copy, a block freed before
it was copied or a wrong block table after swap-in reads a wrong identity. A swapped
sequence holds no device block and exactly its host blocks, resumes with the computed
tokens it had, and host reference counts are checked like device ones: no host block
leaks, whatever is aborted.

Some runs speculate: before each step every decoding sequence gets 0-3 random draft
tokens; the fake model writes their identities (context plus drafts) like any token's,
and a random number of them is accepted (the sampled token then differs from the next
draft, as a real verification's would). A rejected draft's KV has a wrong identity for
the sequence's real tokens, so counting it as computed, or caching a block holding it,
shows up as a wrong read later.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, cast

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvrelay_worker.engine.kv.kv_cache import KVCacheManager
from kvrelay_worker.engine.kv.swap_space import SwapSpace
from kvrelay_worker.engine.sample.stop_conditions import StopConditions
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.sched.preemption import PreemptionPolicy, SwapCostModel
from kvrelay_worker.engine.sched.prefill_pacing import PrefillPacer
from kvrelay_worker.engine.sched.scheduler import Scheduler
from kvrelay_worker.engine.sched.scheduler_output import ScheduledSequence, SchedulerOutput
from kvrelay_worker.engine.sched.sequence import Sequence, SequenceStatus
from kvrelay_worker.engine.sched.step_cost import StepShape

if TYPE_CHECKING:
    from kvrelay_worker.engine.sample.detokenizer import IncrementalDetokenizer

BLOCK_SIZE = 4
# Tokens come from a tiny alphabet so that equal prompts and equal generated tails are
# common; the shared prefixes have block-aligned and unaligned lengths.
ALPHABET = 5
_rng = random.Random(1234)
PREFIXES = [[_rng.randrange(ALPHABET) for _ in range(n)] for n in (8, 13, 21)]

Identity = tuple[str | None, tuple[int, ...]]


def synthetic_step_ms(shape: StepShape) -> float:
    """A made-up step time for the pacer's cost model to learn: the machine is a formula."""
    return 0.2 + 0.05 * shape.decode_rows + 0.1 * shape.prefill_tokens


def wait_key(seq: Sequence) -> tuple[int, int, int]:
    return (-seq.priority, seq.arrival_order, seq.seq_id)


def victim_key(seq: Sequence) -> tuple[int, int, int]:
    """The order preemption takes victims in: lowest priority, then newest, first."""
    return (seq.priority, -seq.arrival_order, -seq.seq_id)



class _StopString:
    """A detokenizer's stand-in: says whether a stop string completed, the same for
    every token of the step (the test draws it per sequence)."""

    def __init__(self, stopped: bool) -> None:
        self.stopped = stopped

    def add_token(self, token_id: int) -> bool:
        return self.stopped

class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.live: list[Sequence] = []
        self.finished: list[Sequence] = []
        self.kv_content: dict[int, Identity] = {}
        self.host_content: dict[int, Identity] = {}
        self.arrivals = 0
        self.num_steps = 0
        self.num_requests = 0

    @initialize(
        num_blocks=st.integers(4, 16),
        max_num_seqs=st.integers(1, 5),
        budget=st.integers(1, 24),
        chunked=st.booleans(),
        caching=st.booleans(),
        window=st.sampled_from([None, None, 5, 9]),
        mode=st.sampled_from(["recompute", "swap", "auto"]),
        host_blocks=st.integers(1, 8),
        # With one token/s and one byte/s, swapping a block out and back costs twice its
        # bytes in seconds, recomputing it BLOCK_SIZE: auto swaps, recomputes, or mixes.
        block_bytes=st.sampled_from([1, 2, 3, 4]),
        # A latency target (ms of synthetic_step_ms) sizing prompt chunks, or none.
        target_ms=st.sampled_from([None, None, 0.5, 3.0]),
        speculate=st.booleans(),
    )
    def setup(self, num_blocks: int, max_num_seqs: int, budget: int, chunked: bool,
              caching: bool, window: int | None, mode: str, host_blocks: int,
              block_bytes: int, target_ms: float | None, speculate: bool) -> None:
        self.speculate = speculate
        # As the engine guarantees: one sequence of max_model_len fits the pool, and
        # without chunked prefill one step's budget fits a whole sequence.
        self.max_len = min(num_blocks * BLOCK_SIZE, 40)
        if not chunked:
            budget = max(budget, self.max_len)
        self.caching = caching
        self.window = window
        self.kv = KVCacheManager(num_blocks, BLOCK_SIZE, caching, model_id="m",
                                 sliding_window=window)
        self.mode = mode
        cost = SwapCostModel(bytes_per_block=block_bytes, prefill_tokens_per_s=1.0,
                             copy_bytes_per_s=1.0)
        policy = PreemptionPolicy("swap" if mode == "swap" else "auto", cost)
        self.swap = SwapSpace(host_blocks) if mode != "recompute" else None
        pacer = (PrefillPacer(target_ms, min_chunk=min(budget, 3))
                 if target_ms is not None and chunked else None)
        self.sched = Scheduler(self.kv, max_num_seqs, budget, enable_chunked_prefill=chunked,
                               stop=StopConditions(max_model_len=self.max_len),
                               swap=self.swap, preemption=policy, pacer=pacer)

    # ------------------------------------------------------------------ operations

    @rule(
        prefix=st.sampled_from([None, 0, 1, 2]),
        suffix=st.lists(st.integers(0, ALPHABET - 1), max_size=10),
        priority=st.integers(0, 2),
        max_tokens=st.integers(1, 12),
        n=st.sampled_from([1, 1, 1, 2, 3]),
        salt=st.sampled_from([None, None, "tenant"]),
    )
    def add(self, prefix: int | None, suffix: list[int], priority: int, max_tokens: int,
            n: int, salt: str | None) -> None:
        prompt = (PREFIXES[prefix] if prefix is not None else []) + suffix
        prompt = prompt[: self.max_len - 1] or [0]
        params = SamplingParams(max_tokens=max_tokens, n=n)
        first: Sequence | None = None
        for index in range(n):
            seq = Sequence(request_id=f"r{self.num_requests}", choice_index=index,
                           token_ids=list(prompt), num_prompt_tokens=len(prompt),
                           params=params, priority=priority, arrival_order=self.arrivals,
                           cache_salt=salt)
            if first is None:
                first = seq
            elif self.caching:
                seq.waits_for = first
            self.sched.add(seq)
            self.live.append(seq)
        self.arrivals += 1
        self.num_requests += 1

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
        stop_chance = data.draw(st.sampled_from([0.0, 0.1, 0.5]))
        self._step(rng, stop_chance)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.live))
        self._finish(seq, SequenceStatus.FINISHED_ABORTED)

    @precondition(lambda self: bool(self.live))
    @rule()
    def abort_everything(self) -> None:
        for seq in list(self.live):
            self._finish(seq, SequenceStatus.FINISHED_ABORTED)
        self._check_all_free()

    # ------------------------------------------------------------ simulated engine

    def _finish(self, seq: Sequence, status: SequenceStatus) -> None:
        self.sched.finish(seq, status)
        assert list(seq.block_table) == []
        assert self.kv.num_blocks_held(seq) == 0
        assert self.swap is None or not self.swap.holds(seq), "host blocks kept"
        self.live.remove(seq)
        self.finished.append(seq)

    def _identity(self, seq: Sequence, position: int,
                  drafts: tuple[int, ...] = ()) -> Identity:
        return (seq.cache_salt, tuple([*seq.token_ids, *drafts][: position + 1]))

    def _propose(self, rng: random.Random) -> None:
        """Random drafts for the decoding sequences, as a proposer would set them."""
        for seq in self.live:
            seq.draft_token_ids = []
        if not self.speculate:
            return
        for seq in self.sched.running:
            if seq.num_tokens - seq.num_computed_tokens == 1:
                seq.draft_token_ids = [rng.randrange(ALPHABET)
                                       for _ in range(rng.randrange(4))]

    def _verify(self, rng: random.Random, item: ScheduledSequence) -> tuple[int, int]:
        """(accepted drafts, sampled token) of a verification, as a real one could end."""
        accepted = rng.randrange(len(item.drafts) + 1)
        if accepted == len(item.drafts):
            return accepted, rng.randrange(ALPHABET)
        rejected = item.drafts[accepted]
        return accepted, rng.choice([t for t in range(ALPHABET) if t != rejected])

    def _slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE

    def _copy_blocks(self, src: dict[int, Identity], dst: dict[int, Identity],
                     pairs: list[tuple[int, int]]) -> None:
        """What the engine's swap copies do, slot by slot, to the fake caches."""
        for src_block, dst_block in pairs:
            for offset in range(BLOCK_SIZE):
                identity = src.get(src_block * BLOCK_SIZE + offset)
                if identity is None:
                    dst.pop(dst_block * BLOCK_SIZE + offset, None)
                else:
                    dst[dst_block * BLOCK_SIZE + offset] = identity

    def _step(self, rng: random.Random, stop_chance: float) -> None:
        waiting_before = set(self.sched.waiting_sequences())
        swapped_before = {seq: seq.num_computed_tokens for seq in waiting_before
                          if seq.status is SequenceStatus.SWAPPED}
        self._propose(rng)
        out = self.sched.schedule()
        self.num_steps += 1
        self._check_schedule(out, waiting_before)
        assert not (out.swap_out and out.swap_in), "swapped out and in in one step"
        for item in out.scheduled:  # a resumed sequence is not prefilled again
            if item.seq in swapped_before:
                assert item.seq.num_computed_tokens == swapped_before[item.seq]
        # Before the forward pass writes anything, as the engine does.
        self._copy_blocks(self.kv_content, self.host_content, out.swap_out)
        self._copy_blocks(self.host_content, self.kv_content, out.swap_in)
        pool = self.kv.pool
        for item in out.scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            assert len(seq.block_table) * BLOCK_SIZE >= start + item.num_new_tokens
            first = 0 if self.window is None else max(0, start - self.window + 1)
            for position in range(first, start):  # the context attention reads
                assert self.kv_content.get(self._slot(seq, position)) == self._identity(
                    seq, position), f"seq {seq.seq_id} reads wrong KV at position {position}"
            for position in range(start, start + item.num_new_tokens):
                block = pool.blocks[seq.block_table[position // BLOCK_SIZE]]
                assert block.ref_cnt == 1, "writing into a block another sequence holds"
                assert block.block_hash is None, "writing into a published (cached) block"
                self.kv_content[self._slot(seq, position)] = self._identity(
                    seq, position, item.drafts)
        items = [item for item in out.scheduled if item.samples]
        sampling = [item.seq for item in items]
        for item in items:
            assert (item.seq.num_computed_tokens + item.num_new_tokens - len(item.drafts)
                    == item.seq.num_tokens)
        verdicts = [self._verify(rng, item) for item in items]
        rows: list[int] = []  # the target's samples: n drafts confirmed, then its token
        for item, (n, token) in zip(items, verdicts, strict=True):
            rows += [*item.drafts[:n], token, *[0] * (len(item.drafts) - n)]
        stops = {seq.seq_id: rng.random() < stop_chance for seq in sampling}
        for seq in sampling:
            seq.detok = cast("IncrementalDetokenizer", _StopString(stops[seq.seq_id]))
        before = [(seq.num_tokens, seq.num_output_tokens) for seq in sampling]
        assert out.layout.sampling == items
        update = self.sched.update_from_output(out.layout, rows)
        self.sched.observe_step(out, synthetic_step_ms(out.shape))
        assert update.accepted == [n for n, _ in verdicts]
        for item, (n, token), (num_tokens, num_out), num_appended in zip(
                items, verdicts, before, update.appended, strict=True):
            seq = item.seq
            expected: SequenceStatus | None = None
            appended: list[int] = []
            for t in [*item.drafts[:n], token]:  # each appended token is checked in turn
                appended.append(t)
                length_done = (num_out + len(appended) >= (seq.params.max_tokens or 0)
                               or num_tokens + len(appended) >= self.max_len)
                if stops[seq.seq_id]:
                    expected = SequenceStatus.FINISHED_STOPPED
                elif length_done:
                    expected = SequenceStatus.FINISHED_LENGTH
                if expected is not None:
                    break
            assert seq.token_ids[num_tokens:] == appended
            assert num_appended == len(appended)
            if expected is None:
                assert not seq.is_finished
                assert seq.num_computed_tokens == seq.num_tokens - 1
            else:
                assert seq.status is expected
                assert list(seq.block_table) == []
                self.live.remove(seq)
                self.finished.append(seq)

    # ------------------------------------------------------------------- checks

    def _check_schedule(self, out: SchedulerOutput, waiting_before: set[Sequence]) -> None:
        sched = self.sched
        assert out.num_batched_tokens <= sched.max_num_batched_tokens
        assert len(sched.running) <= sched.max_num_seqs
        seqs = [item.seq for item in out.scheduled]
        assert len({s.seq_id for s in seqs}) == len(seqs), "a sequence scheduled twice"
        for item in out.scheduled:
            seq = item.seq
            assert item.num_new_tokens >= 1
            assert seq.status is SequenceStatus.RUNNING
            assert seq in sched.running
            assert (seq.num_computed_tokens + item.num_new_tokens - len(item.drafts)
                    <= seq.num_tokens)
            if item.drafts:  # a decoding sequence's proposed drafts, in order
                assert seq.num_computed_tokens == seq.num_tokens - 1
                assert list(item.drafts) == seq.draft_token_ids[: len(item.drafts)]
            if not sched.enable_chunked_prefill:
                assert item.samples, "without chunked prefill a prompt runs whole"
            assert seq.num_cached_tokens >= 0
            assert seq.num_cached_tokens % BLOCK_SIZE == 0
            assert seq.num_cached_tokens < seq.num_tokens
        swapped_out = 0
        for seq in out.preempted:
            assert seq not in seqs
            if seq.status is SequenceStatus.SWAPPED:
                assert self.mode != "recompute"
                assert self.swap is not None
                assert self.swap.holds(seq)
                swapped_out += len(self.swap.get(seq).host_blocks)
            else:
                assert seq.status is SequenceStatus.WAITING
        assert len(out.swap_out) == swapped_out
        # Victims are taken lowest-ranked first among all running sequences, batched or
        # not: every sequence still running (scheduled ones included) outranks every
        # sequence this step preempted, so none has a lower priority than a victim.
        for victim in out.preempted:
            for seq in sched.running:
                assert victim_key(seq) > victim_key(victim), (
                    f"seq {victim.seq_id} (priority {victim.priority}) preempted while "
                    f"seq {seq.seq_id} (priority {seq.priority}) kept running")
        # Admission is by (priority, arrival): a sequence admitted this step outranks
        # every sequence left waiting, except siblings deferred until choice 0's prompt
        # is cached, and prompts whose next uncached block a running sequence is
        # prefilling (they wait for it to be cached).
        admitted = [s for s in seqs if s in waiting_before]
        if admitted:
            assert not out.preempted, "admitted in a step that had to preempt"
            worst = max(wait_key(s) for s in admitted)
            in_flight = self._blocks_being_prefilled()
            for seq in sched.waiting_sequences():
                if seq.waits_for is None and not self._next_block_in(seq, in_flight):
                    assert wait_key(seq) > worst, "a lower-priority request was admitted first"

    def _blocks_being_prefilled(self) -> set[bytes]:
        """Hashes of the full blocks running sequences have yet to prefill."""
        hashes: set[bytes] = set()
        for seq in self.sched.running:
            if seq.num_tokens - seq.num_computed_tokens > 1:
                self.kv.update_block_hashes(seq)
                hashes.update(seq.block_hashes[seq.num_computed_tokens // BLOCK_SIZE:
                                               seq.num_tokens // BLOCK_SIZE])
        return hashes

    def _next_block_in(self, seq: Sequence, hashes: set[bytes]) -> bool:
        """Whether ``seq`` shares a block a running sequence has yet to prefill. (Which of
        its blocks was next when the scheduler looked can change within the step: an
        admission may evict cached blocks of its prefix.)"""
        if not self.caching or seq.status is SequenceStatus.SWAPPED:
            return False
        self.kv.update_block_hashes(seq)
        limit = (seq.num_tokens - 1) // BLOCK_SIZE
        return any(block_hash in hashes for block_hash in seq.block_hashes[:limit])

    @invariant()
    def pool_is_consistent(self) -> None:
        if not hasattr(self, "kv"):
            return
        pool = self.kv.pool
        holders: dict[int, list[tuple[Sequence, int]]] = {}
        for seq in self.sched.running:
            assert seq.status is SequenceStatus.RUNNING
            released = self.kv.num_released(seq)
            if self.window is None:
                assert released == 0
            else:  # exactly the blocks wholly behind the next token's window
                behind = max(0, seq.num_computed_tokens - self.window + 1) // BLOCK_SIZE
                assert released == min(behind, len(seq.block_table)), "window release"
            table = seq.block_table[released:]
            assert len(set(table)) == len(table), "a block twice in one table"
            assert (released + len(table)) * BLOCK_SIZE >= seq.num_computed_tokens
            assert self.kv.num_blocks_held(seq) == len(table)
            for index, block_id in enumerate(table, start=released):
                holders.setdefault(block_id, []).append((seq, index))
        host_holders: dict[int, int] = {}
        for seq in self.sched.waiting_sequences():
            assert list(seq.block_table) == []
            assert self.kv.num_blocks_held(seq) == 0
            if seq.status is SequenceStatus.SWAPPED:
                assert self.swap is not None
                assert self.swap.holds(seq)
                record = self.swap.get(seq)
                assert seq.num_computed_tokens > 0
                # Exactly the blocks that were live: computed ones not behind the window,
                # and at most the room for the next token (a victim already batched gave
                # back what its step had allocated, drafts' slots included).
                blocks = -(-seq.num_computed_tokens // BLOCK_SIZE)
                assert record.num_released + len(record.host_blocks) >= blocks
                room = -(-(seq.num_computed_tokens + 1) // BLOCK_SIZE)
                assert record.num_released + len(record.host_blocks) <= room, (
                    "swapped out blocks past its computed tokens")
                for block in record.host_blocks:
                    host_holders[block.block_id] = host_holders.get(block.block_id, 0) + 1
            else:
                assert seq.status is SequenceStatus.WAITING
                assert seq.num_computed_tokens == 0
                assert self.swap is None or not self.swap.holds(seq)
        for seq in self.sched.running:
            assert self.swap is None or not self.swap.holds(seq)
        if self.swap is not None:
            host = self.swap.pool
            assert self.swap.num_swapped == sum(
                1 for s in self.sched.waiting_sequences() if s.status is SequenceStatus.SWAPPED)
            for block in host.blocks:
                assert block.ref_cnt == host_holders.get(block.block_id, 0), "host ref count"
                assert (block in host.free_queue) == (block.ref_cnt == 0)
                assert block.block_hash is None, "host blocks are never cached"
            assert host.num_free_blocks == sum(1 for b in host.blocks if b.ref_cnt == 0)
        assert set(self.sched.running) | set(self.sched.waiting_sequences()) == set(self.live)
        assert len(self.sched.running) + self.sched.num_waiting == len(self.live)
        for block in pool.blocks:
            held_by = holders.get(block.block_id, [])
            assert block.ref_cnt >= 0
            assert block.ref_cnt == len(held_by), f"{block} held by {len(held_by)}"
            assert (block in pool.free_queue) == (block.ref_cnt == 0)
            if len(held_by) > 1:
                assert block.block_hash is not None, "uncached block shared"
                indices = {index for _, index in held_by}
                assert len(indices) == 1, "a shared block at different positions"
                (index,) = indices
                for seq, _ in held_by:
                    assert seq.num_computed_tokens >= (index + 1) * BLOCK_SIZE
                    assert seq.block_hashes[index] == block.block_hash
        assert pool.num_free_blocks == sum(1 for b in pool.blocks if b.ref_cnt == 0)
        assert len(list(pool.free_queue)) == pool.num_free_blocks
        for block_hash, block in pool.cached.items():
            assert block.block_hash == block_hash
        if not self.live:
            self._check_all_free()

    def _check_all_free(self) -> None:
        assert not self.sched.has_unfinished()
        assert self.kv.num_free_blocks == self.kv.num_blocks, "blocks leaked"
        if self.swap is not None:
            assert self.swap.num_free_blocks == self.swap.num_blocks, "host blocks leaked"
            assert self.swap.num_swapped == 0

    def teardown(self) -> None:
        if not hasattr(self, "kv"):
            return
        # Every request completes (no stop at random), in a bounded number of steps.
        rng = random.Random(0)
        remaining = sum(self.max_len - s.num_computed_tokens for s in self.live)
        limit = 4 * remaining * max(1, len(self.live)) + 10
        steps = 0
        while self.live:
            assert steps < limit, "the scheduler stopped making progress"
            self._step(rng, stop_chance=0.0)
            self.pool_is_consistent()
            steps += 1
        self._check_all_free()


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
