"""Continuous batching: which sequences run in the next step, and how many tokens each.

Every step, running sequences go first (a decode is one token; a prompt still being
prefilled gets its next chunk), then waiting ones are admitted by priority and arrival
while the token budget, the sequence limit and the KV pool allow. When the pool cannot
hold a running sequence's next tokens, the lowest-priority, newest running sequence is
preempted, even one already placed in this step's batch (it is taken out again: its
tokens go back to the step's budget, the blocks this step gave it to the pool), so a
higher-priority sequence never loses its blocks while a lower-priority one keeps its own.
It is preempted by recompute (its blocks are freed and it is prefilled again; what
the prefix cache still holds is not recomputed) or by swap (its live blocks are copied to
a host pool, ``SchedulerOutput.swap_out``, and it keeps its computed tokens), as the
``PreemptionPolicy`` says. Either way it goes back to the waiting queue under its own
priority and arrival, so it resumes before anything that arrived after it; a swapped
sequence resumes by swap-in (fresh blocks, ``SchedulerOutput.swap_in``), never as a new
prompt, and blocks the queue behind it until its live blocks fit.

A step never both swaps out and swaps in: preemptions happen while placing running
sequences, resumes and admissions only in a step that preempted nothing. The engine
performs a step's copies before its forward pass, swap-outs first.

The scheduler is the only writer of a sequence's progress: ``schedule`` allocates and
counts prefix-cache hits, ``update_from_output`` applies what a step computed and
sampled (computed tokens, newly full blocks to the cache, the new token, the finish).
Beam search (``reseat_beams``): the beams of a request are one unit for preemption and
admission. Preempting one beam preempts every beam of its request, always by recompute
(never swap: sharing would be lost); waiting beams of a request are admitted together or
not at all. A request's beams thus never wait on each other for room; the price is that
the pool must hold all of a request's beams after a recompute.

Prompt chunks fill the fixed token budget (``max_num_batched_tokens``), or, with a
``PrefillPacer`` (``EngineConfig.target_step_ms``), only what its measured cost model
predicts fits the latency target beside the step's decodes (``prefill_pacing.py``); the
budget then stays an upper bound. The engine reports each step's time (``observe_step``).
A waiting prompt whose next uncached block a running prefill is computing stays queued
until that block is cached (``prefills_in_flight.py``): prompts arriving together over a
shared prefix compute it once.

Until ``update_from_output`` runs, a scheduled step has changed nothing that running it
again would not repeat, so a step that fails can be retried, whole or in part.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from kvrelay_worker.engine.kv_cache import KVCacheManager
from kvrelay_worker.engine.preemption import PreemptionPolicy
from kvrelay_worker.engine.prefill_pacing import PrefillPacer, StepPlan
from kvrelay_worker.engine.prefills_in_flight import PrefillsInFlight
from kvrelay_worker.engine.sequence import Sequence, SequenceStatus
from kvrelay_worker.engine.step_cost import StepShape
from kvrelay_worker.engine.stop_conditions import StopConditions
from kvrelay_worker.engine.swap_space import SwapSpace

# Told each sampled token after it is appended; True when it completed a stop string.
StopStringCheck = Callable[[Sequence, int], bool]


@dataclass
class ScheduledSequence:
    """A sequence's share of a step: ``num_new_tokens`` queries, the last ``len(drafts)``
    of them draft tokens to verify (speculative decoding) after its one real new token."""

    seq: Sequence
    num_new_tokens: int
    drafts: tuple[int, ...] = ()

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the sequence, so a token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens >= self.seq.num_tokens

    @property
    def num_sampling_rows(self) -> int:
        """Logit rows this item yields: one per draft plus the target's own next token."""
        return len(self.drafts) + 1 if self.samples else 0


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # Block copies to make before this step's forward pass: (device id, host id) pairs
    # out to the host pool, then (host id, device id) pairs back in.
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Copy-on-write block copies (source id, destination id), made after the swaps.
    copies: list[tuple[int, int]] = field(default_factory=list)
    # What the step computes, for the cost model (set once the batch is final).
    shape: StepShape = field(default_factory=StepShape)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class SchedulerStats:
    preemptions: int = 0  # swaps_out + recomputes
    swaps_out: int = 0
    swaps_in: int = 0
    recomputes: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # Steps in which a waiting prompt stayed queued for blocks another prompt was
    # prefilling (``prefills_in_flight``): counted once per prompt per step.
    prefill_waits: int = 0
    max_batch_size: int = 0


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool = True,
                 stop: StopConditions | None = None, swap: SwapSpace | None = None,
                 preemption: PreemptionPolicy | None = None,
                 pacer: PrefillPacer | None = None) -> None:
        self.kv = kv
        self.pacer = pacer
        self.swap = swap
        self.preemption = preemption or PreemptionPolicy()
        self.stop = stop or StopConditions()
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.running: list[Sequence] = []
        self._waiting: list[tuple[int, int, int, Sequence]] = []
        self.stats = SchedulerStats()

    # ----------------------------------------------------------------- queue handling

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def waiting_sequences(self) -> list[Sequence]:
        return [entry[3] for entry in sorted(self._waiting)]

    @property
    def num_swapped(self) -> int:
        return self.swap.num_swapped if self.swap is not None else 0

    def add(self, seq: Sequence, status: SequenceStatus = SequenceStatus.WAITING) -> None:
        seq.status = status
        # Higher priority first, then arrival order; the seq id breaks the last ties.
        heapq.heappush(self._waiting, (-seq.priority, seq.arrival_order, seq.seq_id, seq))

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """Mark ``seq`` finished and free its blocks (host ones too), wherever it is."""
        if seq.is_finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        else:
            self._remove_waiting(seq)
        seq.status = status
        self.kv.free(seq)
        if self.swap is not None:
            self.swap.free(seq)

    def _remove_waiting(self, seq: Sequence) -> None:
        for i, entry in enumerate(self._waiting):
            if entry[3] is seq:
                self._waiting[i] = self._waiting[-1]
                self._waiting.pop()
                heapq.heapify(self._waiting)
                return

    def has_unfinished(self) -> bool:
        return bool(self.running or self._waiting)

    # ------------------------------------------------------------------------ update

    def update_from_output(self, scheduled: Seq[ScheduledSequence], sampled: Seq[int],
                           stop_string: StopStringCheck | None = None,
                           accepted: Seq[int] | None = None) -> list[Sequence]:
        """Apply what a step did for ``scheduled``: the one place sequences advance.

        Every item's computed tokens advance, its newly full blocks go to the prefix
        cache and blocks behind a sliding window go back to the pool; then each item that
        sampled (``sampled`` holds their tokens, in order) gets its token appended,
        ``stop_string`` is asked about it, and a sequence that is done is finished and its
        blocks freed. Returns the sequences that got a token.

        Speculative decoding: ``accepted[i]`` drafts of sampling item ``i`` were verified;
        they are appended (each checked like any token) before its sampled token, their
        KV counts as computed, and the slots of the rejected ones are simply not counted
        (later steps overwrite them; blocks wholly past the sequence go back to the pool).
        """
        sampling = [item for item in scheduled if item.samples]
        if len(sampling) != len(sampled):
            raise ValueError(f"{len(sampled)} sampled tokens for {len(sampling)} rows")
        num_accepted = list(accepted) if accepted is not None else [0] * len(sampling)
        accepted_of = {id(item): n for item, n in zip(sampling, num_accepted, strict=True)}
        for item in scheduled:
            n = accepted_of.get(id(item), 0)
            if n not in range(len(item.drafts) + 1):
                raise ValueError(f"{n} accepted drafts of {len(item.drafts)}")
            item.seq.num_computed_tokens += item.num_new_tokens - len(item.drafts)
            self.kv.publish_computed_blocks(item.seq)
            self.kv.release_out_of_window(item.seq)
        for item, token in zip(sampling, sampled, strict=True):
            seq = item.seq
            if seq.params.is_beam_search:
                continue  # beams advance together, by ``reseat_beams``
            drafts = item.drafts[: accepted_of[id(item)]]
            for i, t in enumerate((*drafts, token)):
                seq.append_token(t)
                if i < len(drafts):  # an accepted draft's KV was computed by this step
                    seq.num_computed_tokens += 1
                stopped = stop_string(seq, t) if stop_string is not None else False
                status = self.stop.finish_status(seq, t, stopped)
                if status is not None:
                    self.finish(seq, status)
                    break
            if item.drafts and not seq.is_finished:
                self.kv.publish_computed_blocks(seq)
                self.kv.release_out_of_window(seq)
                self.kv.free_blocks_after(seq, seq.num_tokens)
        return [item.seq for item in sampling]

    # ---------------------------------------------------------------------- schedule

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled_ids: set[int] = set()
        plan = self._plan()

        # Running sequences first, oldest admission first.
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            remaining = seq.num_tokens - seq.num_computed_tokens
            num_new = self._chunk(plan, seq.num_computed_tokens, remaining, budget)
            if num_new <= 0 or num_new > budget:
                continue
            drafts = self._drafts_that_fit(seq, remaining, budget - num_new)
            if drafts:
                num_new += len(drafts)
            else:
                fits, given_back = self._make_room(seq, num_new, out, scheduled_ids)
                budget += given_back
                if not fits:
                    continue
            out.scheduled.append(ScheduledSequence(seq, num_new, drafts))
            scheduled_ids.add(seq.seq_id)
            budget -= num_new

        # Then admit waiting sequences, unless this step already had to preempt.
        if not out.preempted:
            self._admit(out, budget, plan)

        self.stats.max_batch_size = max(self.stats.max_batch_size, len(out.scheduled))
        out.copies = self.kv.take_copies()
        out.shape = StepShape.of((item.seq.num_computed_tokens, item.num_new_tokens,
                                  len(item.drafts)) for item in out.scheduled)
        return out

    def _drafts_that_fit(self, seq: Sequence, remaining: int, budget: int) -> tuple[int, ...]:
        """The proposed drafts of a decoding ``seq`` this step verifies: as many as the
        token budget leaves, and only if the pool has their slots without preempting
        anyone (speculation is optional work: it never costs another sequence its place).
        """
        if remaining != 1 or not seq.draft_token_ids or budget <= 0:
            return ()
        drafts = tuple(seq.draft_token_ids[:budget])
        if not self.kv.allocate_slots(seq, 1 + len(drafts)):
            return ()
        return drafts

    def observe_step(self, out: SchedulerOutput, ms: float) -> None:
        """The engine ran ``out`` in ``ms`` milliseconds: teach the pacer's cost model."""
        if self.pacer is not None and not out.is_empty:
            self.pacer.observe(out.shape, ms)

    def _plan(self) -> StepPlan | None:
        """With a pacer, this step's plan, starting from its running decodes."""
        if self.pacer is None:
            return None
        decodes = [s.num_computed_tokens for s in self.running
                   if s.num_tokens - s.num_computed_tokens == 1]
        return self.pacer.plan(decodes)

    def _chunk(self, plan: StepPlan | None, context: int, remaining: int, budget: int) -> int:
        """New tokens for a sequence with ``remaining`` to compute; 0 when none this step.

        Without chunked prefill all of them (the caller skips what the budget cannot
        take); with a plan, a decode is one token and a prompt chunk what the plan allows;
        else as much as the budget holds.
        """
        if not self.enable_chunked_prefill:
            return remaining
        if plan is None:
            return min(remaining, budget)
        if remaining == 1:
            plan.place_decode()
            return 1
        return plan.prefill_chunk(context, remaining, budget)

    def reseat_beams(self, beams: list[Sequence], parents: list[int], tokens: list[int]) -> None:
        """Beam ``i`` becomes beam ``parents[i]`` plus ``tokens[i]``: the parent's blocks
        shared (copy-on-write), its computed tokens kept. New beams (not yet scheduled)
        may be among ``beams``; every parent must be among the first ones."""
        sources = [beams[p] for p in parents]
        snapshot = [(list(s.token_ids), s.num_computed_tokens, list(s.block_hashes),
                     s.status) for s in sources]
        for beam in beams:
            if beam in self.running:
                self.running.remove(beam)
            elif not beam.is_finished:
                self._remove_waiting(beam)
        self.kv.share_blocks(beams, sources)
        for beam, (ids, computed, hashes, status), token in zip(beams, snapshot, tokens,
                                                               strict=True):
            beam.token_ids = [*ids, token]
            beam.num_computed_tokens = computed
            beam.block_hashes = hashes
            if status is SequenceStatus.RUNNING:
                beam.status = status
                self.running.append(beam)
            else:
                self.add(beam)

    def _siblings(self, seq: Sequence) -> list[Sequence]:
        """The running beams of ``seq``'s request, ``seq`` included (just ``seq`` otherwise)."""
        if not seq.params.is_beam_search:
            return [seq]
        return [s for s in self.running if s.request_id == seq.request_id] or [seq]

    def _make_room(self, seq: Sequence, num_new: int, out: SchedulerOutput,
                   scheduled_ids: set[int]) -> tuple[bool, int]:
        """Allocate for ``seq``, preempting others (or ``seq`` itself) until it fits.

        Returns whether it fits, and the tokens of this step's batch that the preempted
        sequences gave back (they were already placed in it).
        """
        given_back = 0
        while not self.kv.allocate_slots(seq, num_new):
            victim = self._pick_victim()
            if victim is seq or victim in self._siblings(seq):
                return False, given_back + self._preempt_group(seq, out, scheduled_ids)
            given_back += self._preempt_group(victim, out, scheduled_ids)
        return True, given_back

    def _preempt_group(self, seq: Sequence, out: SchedulerOutput,
                       scheduled_ids: set[int]) -> int:
        """Preempt ``seq``, or all of its request's beams; returns the batched tokens the
        members already in this step's batch gave back."""
        given_back = 0
        for member in self._siblings(seq):
            if member.seq_id in scheduled_ids:
                given_back += self._unschedule(member, out, scheduled_ids)
            self._preempt(member, out)
        return given_back

    def _unschedule(self, seq: Sequence, out: SchedulerOutput, scheduled_ids: set[int]) -> int:
        """Take ``seq`` out of this step's batch; returns its tokens, for the budget.

        The blocks this step gave it (room past its computed tokens, drafts' slots
        included) go back to the pool, so a swap-out copies only computed KV. Beams keep
        theirs until ``_preempt`` frees them all, with any copy-on-write copy into them.
        """
        scheduled_ids.discard(seq.seq_id)
        (item,) = [i for i in out.scheduled if i.seq is seq]
        out.scheduled.remove(item)
        if not seq.params.is_beam_search:
            self.kv.free_blocks_after(seq, seq.num_computed_tokens)
        return item.num_new_tokens

    def _pick_victim(self) -> Sequence:
        """Lowest priority first, then the newest, whether or not already batched: a
        sequence never loses its blocks while a lower-priority one keeps its own."""
        return min(self.running, key=lambda s: (s.priority, -s.arrival_order, -s.seq_id))

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        seq.num_preemptions += 1
        self.stats.preemptions += 1
        out.preempted.append(seq)
        if self._should_swap(seq):
            assert self.swap is not None
            live, released = self.kv.detach_for_swap(seq)
            host = self.swap.store(seq, len(live), released)
            out.swap_out.extend(zip(live, host, strict=True))
            self.stats.swaps_out += 1
            self.add(seq, SequenceStatus.SWAPPED)
            return
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        self.stats.recomputes += 1
        self.add(seq)

    def _should_swap(self, seq: Sequence) -> bool:
        """Swap when the policy prefers it and the host pool has room; else recompute."""
        if (self.swap is None or self.preemption.mode == "recompute"
                or seq.params.is_beam_search or seq.num_computed_tokens == 0):
            return False
        live = self.kv.num_blocks_held(seq)
        if not self.swap.can_hold(live):
            return False
        kept = self.kv.num_prefix_blocks_kept(seq) * self.kv.block_size
        return self.preemption.wants_swap(max(0, seq.num_computed_tokens - kept), live)

    def _swap_in(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
        """Resume a swapped sequence if its live blocks and next tokens fit the pool."""
        assert self.swap is not None
        record = self.swap.get(seq)
        num_live = len(record.host_blocks)
        needed = self.kv.blocks_to_resume(seq, num_live, record.num_released, num_new)
        if needed > self.kv.num_free_blocks:
            return False
        device = self.kv.attach_swapped(seq, num_live, record.num_released)
        out.swap_in.extend(zip(record.host_ids, device, strict=True))
        self.swap.free(seq)
        if not self.kv.allocate_slots(seq, num_new):
            raise AssertionError("room for a swap-in was checked")
        self.stats.swaps_in += 1
        return True

    def _admit(self, out: SchedulerOutput, budget: int, plan: StepPlan | None) -> None:
        deferred: list[tuple[int, int, int, Sequence]] = []
        in_flight: PrefillsInFlight | None = None
        while self._waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            entry = self._waiting[0]
            seq = entry[3]
            if seq.status is SequenceStatus.SWAPPED:
                remaining = seq.num_tokens - seq.num_computed_tokens
                if remaining > budget and not self.enable_chunked_prefill:
                    break
                num_new = min(self._chunk(plan, seq.num_computed_tokens, remaining, budget),
                              budget)
                if num_new <= 0 or not self._swap_in(seq, num_new, out):
                    break
                heapq.heappop(self._waiting)
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                out.scheduled.append(ScheduledSequence(seq, num_new))
                budget -= num_new
                continue
            if seq.waits_for is not None and not self._sibling_ready(seq):
                # Choices 2..n wait for choice 1's prompt so they hit its cached blocks.
                deferred.append(heapq.heappop(self._waiting))
                continue
            cached = self.kv.find_cached_prefix(seq)
            if in_flight is None:
                in_flight = PrefillsInFlight(self.kv, self.running)
            if in_flight.holds_next_block(seq, len(cached)):
                # Another prompt is computing its next blocks: wait for them to be cached.
                deferred.append(heapq.heappop(self._waiting))
                self.stats.prefill_waits += 1
                continue
            num_cached = len(cached) * self.kv.block_size
            remaining = seq.num_tokens - num_cached
            if remaining > budget and not self.enable_chunked_prefill:
                break
            num_new = min(self._chunk(plan, num_cached, remaining, budget), budget)
            if num_new <= 0 or not self.kv.allocate_slots(seq, num_new, cached):
                break
            seq.num_computed_tokens += num_cached
            heapq.heappop(self._waiting)
            self.stats.prefix_cache_queries += seq.num_tokens
            self.stats.prefix_cache_hits += num_cached
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = min(num_cached, seq.num_prompt_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            in_flight.add(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            budget -= num_new
        for entry in deferred:
            heapq.heappush(self._waiting, entry)
        self._undo_partial_group(out)

    def _undo_partial_group(self, out: SchedulerOutput) -> None:
        """Put back beams just admitted whose siblings must still wait: all or none.

        Siblings share an arrival order, so they sit side by side in the queue: only the
        last request admitted can be cut short.
        """
        if not out.scheduled or not self._waiting:
            return
        last = out.scheduled[-1].seq
        head = self._waiting[0][3]
        if not last.params.is_beam_search or head.request_id != last.request_id:
            return
        for item in [i for i in out.scheduled if i.seq.request_id == last.request_id]:
            out.scheduled.remove(item)
            self.running.remove(item.seq)
            self.kv.free(item.seq)
            item.seq.num_computed_tokens = 0
            self.add(item.seq)

    def _sibling_ready(self, seq: Sequence) -> bool:
        first = seq.waits_for
        if first is None or first.is_finished or first.prompt_computed:
            seq.waits_for = None
            return True
        return False
