"""How the scheduler treats a beam search's sequences: its beams are one unit.

Preempting one beam preempts every beam of its request, always by recompute (never
swap: the copy-on-write sharing between beams would be lost); waiting beams of a request
are admitted together or not at all. A request's beams thus never wait on each other for
room; the price is that the pool must hold all of a request's beams after a recompute.

The scheduler asks this module which sequences go together and whether one shares its
blocks; ``reseat_beams`` moves the beams on after a search step, through the
scheduler's queue operations.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

from kvrelay_worker.engine.kv.kv_cache import KVCacheManager
from kvrelay_worker.engine.sched.scheduler_output import ScheduledSequence
from kvrelay_worker.engine.sched.sequence import Sequence, SequenceStatus


class BeamQueues(Protocol):
    """What reseating needs of the scheduler (``Scheduler`` is one)."""

    kv: KVCacheManager

    def dequeue(self, seq: Sequence) -> None: ...

    def requeue(self, seq: Sequence, running: bool) -> None: ...


def shares_blocks(seq: Sequence) -> bool:
    """True for a beam: its blocks may be shared with its siblings (copy-on-write), so
    they are never swapped, nor trimmed alone; the group is recomputed whole."""
    return seq.params.is_beam_search


def preemption_unit(seq: Sequence, running: Seq[Sequence]) -> list[Sequence]:
    """The running beams of ``seq``'s request, ``seq`` included (just ``seq`` otherwise)."""
    if not seq.params.is_beam_search:
        return [seq]
    return [s for s in running if s.request_id == seq.request_id] or [seq]


def partial_group(scheduled: Seq[ScheduledSequence], waiting_head: Sequence | None
                  ) -> list[ScheduledSequence]:
    """Beams just admitted whose siblings must still wait (to be put back: all or none).

    Siblings share an arrival order, so they sit side by side in the queue: only the
    last request admitted can be cut short.
    """
    if not scheduled or waiting_head is None:
        return []
    last = scheduled[-1].seq
    if not last.params.is_beam_search or waiting_head.request_id != last.request_id:
        return []
    return [item for item in scheduled if item.seq.request_id == last.request_id]


def reseat_beams(scheduler: BeamQueues, beams: list[Sequence], parents: list[int],
                 tokens: list[int]) -> None:
    """Beam ``i`` becomes beam ``parents[i]`` plus ``tokens[i]``: the parent's blocks
    shared (copy-on-write), its computed tokens kept. New beams (not yet scheduled)
    may be among ``beams``; every parent must be among the first ones."""
    sources = [beams[p] for p in parents]
    snapshot = [(list(s.token_ids), s.num_computed_tokens, list(s.block_hashes),
                 s.status) for s in sources]
    for beam in beams:
        scheduler.dequeue(beam)
    scheduler.kv.share_blocks(beams, sources)
    for beam, (ids, computed, hashes, status), token in zip(beams, snapshot, tokens,
                                                           strict=True):
        beam.token_ids = [*ids, token]
        beam.num_computed_tokens = computed
        beam.block_hashes = hashes
        scheduler.requeue(beam, running=status is SequenceStatus.RUNNING)
