"""Continuous batching: which sequences run in the next step, and how many tokens each.

Every step, running sequences go first (a decode is one token; a prompt still being
prefilled gets its next chunk), then waiting ones are admitted by priority and arrival
while the token budget, the sequence limit, the KV pool and the LoRA adapter slots
(``lora_admission``) allow. When the pool cannot
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
sampled (computed tokens, newly full blocks to the cache, the new tokens, the finish).
A beam search's beams are one unit for preemption and admission (``beam_scheduling``).

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
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from kvrelay_worker.engine.beam.beam_scheduling import partial_group, preemption_unit, shares_blocks
from kvrelay_worker.engine.kv.kv_cache import KVCacheManager
from kvrelay_worker.engine.kv.swap_space import SwapSpace
from kvrelay_worker.engine.sample.stop_conditions import StopConditions
from kvrelay_worker.engine.sched.lora_admission import LoraAdmission
from kvrelay_worker.engine.sched.preemption import PreemptionPolicy
from kvrelay_worker.engine.sched.prefill_pacing import PrefillPacer, StepPlan
from kvrelay_worker.engine.sched.prefills_in_flight import PrefillsInFlight
from kvrelay_worker.engine.sched.scheduler_output import (
    BatchLayout,
    ScheduledSequence,
    SchedulerOutput,
    StepUpdate,
)
from kvrelay_worker.engine.sched.sequence import Sequence, SequenceStatus
from kvrelay_worker.engine.sched.step_cost import StepShape
from kvrelay_worker.engine.spec.verification import accepted_length

__all__ = ["Scheduler", "SchedulerStats"]


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
                 pacer: PrefillPacer | None = None, max_loras: int = 0) -> None:
        self.kv = kv
        # Distinct LoRA adapters running at once (``lora_admission``); 0: LoRA is off.
        self.max_loras = max_loras
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
        self.dequeue(seq)
        seq.status = status
        self.kv.free(seq)
        if self.swap is not None:
            self.swap.free(seq)

    def dequeue(self, seq: Sequence) -> None:
        """Take ``seq`` out of the running list or the queue; its blocks stay its own."""
        if seq in self.running:
            self.running.remove(seq)
        elif not seq.is_finished:
            self._remove_waiting(seq)

    def requeue(self, seq: Sequence, running: bool) -> None:
        """Put a ``dequeue``d sequence back: running (last), or waiting in its place."""
        if running:
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        else:
            self.add(seq)

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

    def update_from_output(self, layout: BatchLayout, row_tokens: Seq[int]) -> StepUpdate:
        """Apply what a step did for ``layout.scheduled``: the one place sequences advance.

        Every item's computed tokens advance, its newly full blocks go to the prefix
        cache and blocks behind a sliding window go back to the pool; then each item that
        sampled gets its tokens from its rows of ``row_tokens`` (one token per logit row),
        each appended and checked (``Sequence.append_token`` reports a stop string), and
        a sequence that is done is finished and its blocks freed.

        Speculative decoding: the drafts an item's rows confirm (``accepted_length``) are
        appended before its sampled token, their KV counted as computed; the slots of the
        rejected ones are simply not counted (later steps overwrite them; blocks wholly
        past the sequence go back to the pool).
        """
        if len(row_tokens) != layout.num_rows:
            raise ValueError(f"{len(row_tokens)} sampled tokens for {layout.num_rows} rows")
        for item in layout.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens - len(item.drafts)
            self.kv.publish_computed_blocks(item.seq)
            self.kv.release_out_of_window(item.seq)
        for span in layout.prompt_spans:
            if span.item.seq.prompt_computed:  # every prompt position is scored
                span.item.seq.scores_prompt = False
        for item in layout.prompt_only:  # max_tokens 0: the prompt was all it asked for
            self.finish(item.seq, SequenceStatus.FINISHED_LENGTH)
        appended: list[int] = []
        accepted: list[int] = []
        for item, row in zip(layout.sampling, layout.first_rows, strict=True):
            seq, drafts = item.seq, item.drafts
            n = accepted_length(row_tokens[row : row + len(drafts) + 1], drafts) if drafts else 0
            accepted.append(n)
            if seq.params.is_beam_search:
                appended.append(0)  # beams advance together, by their beam group
                continue
            appended.append(self._append(seq, row_tokens, row, n))
            if drafts and not seq.is_finished:
                self.kv.publish_computed_blocks(seq)
                self.kv.release_out_of_window(seq)
                self.kv.free_blocks_after(seq, seq.num_tokens)
        return StepUpdate(appended, accepted)

    def _append(self, seq: Sequence, row_tokens: Seq[int], row: int, num_drafts: int) -> int:
        """Append ``num_drafts`` accepted drafts (rows ``row`` on) then the sampled token,
        stopping at the one that finishes ``seq``; returns how many were appended."""
        for i in range(num_drafts + 1):
            token = row_tokens[row + i]
            stopped = seq.append_token(token)
            if i < num_drafts:  # an accepted draft's KV was computed by this step
                seq.num_computed_tokens += 1
            status = self.stop.finish_status(seq, token, stopped)
            if status is not None:
                self.finish(seq, status)
                return i + 1
        return num_drafts + 1

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
        out.layout = BatchLayout.of(out.scheduled)
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

    def prefill_estimate(self) -> int:
        """Prompt tokens the next step will likely compute (for the speculation policy)."""
        pending = sum(s.num_tokens - s.num_computed_tokens for s in self.running
                      if s.num_tokens - s.num_computed_tokens > 1)
        if self._waiting:
            pending += self.max_num_batched_tokens
        return min(pending, self.max_num_batched_tokens)

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

    def _make_room(self, seq: Sequence, num_new: int, out: SchedulerOutput,
                   scheduled_ids: set[int]) -> tuple[bool, int]:
        """Allocate for ``seq``, preempting others (or ``seq`` itself) until it fits.

        Returns whether it fits, and the tokens of this step's batch that the preempted
        sequences gave back (they were already placed in it).
        """
        given_back = 0
        while not self.kv.allocate_slots(seq, num_new):
            victim = self._pick_victim()
            if victim is seq or victim in preemption_unit(seq, self.running):
                return False, given_back + self._preempt_group(seq, out, scheduled_ids)
            given_back += self._preempt_group(victim, out, scheduled_ids)
        return True, given_back

    def _preempt_group(self, seq: Sequence, out: SchedulerOutput,
                       scheduled_ids: set[int]) -> int:
        """Preempt ``seq`` with its unit (``beam_scheduling``); returns the batched tokens
        the members already in this step's batch gave back."""
        given_back = 0
        for member in preemption_unit(seq, self.running):
            if member.seq_id in scheduled_ids:
                given_back += self._unschedule(member, out, scheduled_ids)
            self._preempt(member, out)
        return given_back

    def _unschedule(self, seq: Sequence, out: SchedulerOutput, scheduled_ids: set[int]) -> int:
        """Take ``seq`` out of this step's batch; returns its tokens, for the budget.

        The blocks this step gave it (room past its computed tokens, drafts' slots
        included) go back to the pool, so a swap-out copies only computed KV. Shared
        blocks stay until ``_preempt`` frees them all, with any copy-on-write copy into them.
        """
        scheduled_ids.discard(seq.seq_id)
        (item,) = [i for i in out.scheduled if i.seq is seq]
        out.scheduled.remove(item)
        if not shares_blocks(seq):
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
                or shares_blocks(seq) or seq.num_computed_tokens == 0):
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
        lora = LoraAdmission(self.max_loras, self.running) if self.max_loras else None
        while self._waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            entry = self._waiting[0]
            seq = entry[3]
            if lora is not None and not lora.admits(seq):
                deferred.append(heapq.heappop(self._waiting))  # its adapter has no slot
                continue
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
                if lora is not None:
                    lora.add(seq)
                out.scheduled.append(ScheduledSequence(seq, num_new))
                budget -= num_new
                continue
            if seq.waits_for is not None and not self._sibling_ready(seq):
                # Choices 2..n wait for choice 1's prompt so they hit its cached blocks.
                deferred.append(heapq.heappop(self._waiting))
                continue
            # A prompt whose log-probabilities are asked is computed whole: it takes no
            # cache hit, so it waits for no other prefill either.
            cached = [] if seq.scores_prompt else self.kv.find_cached_prefix(seq)
            if in_flight is None:
                in_flight = PrefillsInFlight(self.kv, self.running)
            if not seq.scores_prompt and in_flight.holds_next_block(seq, len(cached)):
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
            if lora is not None:
                lora.add(seq)
            in_flight.add(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            budget -= num_new
        for entry in deferred:
            heapq.heappush(self._waiting, entry)
        self._undo_partial_group(out)

    def _undo_partial_group(self, out: SchedulerOutput) -> None:
        """Put back what was just admitted of a group whose rest must still wait."""
        head = self._waiting[0][3] if self._waiting else None
        for item in partial_group(out.scheduled, head):
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
