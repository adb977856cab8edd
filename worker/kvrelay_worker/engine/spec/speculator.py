"""The engine's speculation: proposals before a step, bookkeeping after it.

Each step, before scheduling, ``propose`` gives every eligible decoding sequence the
drafts the policy chose (``Sequence.draft_token_ids``); the scheduler verifies what fits
its budget and the pool; after the step ``verified`` learns each sequence's acceptance and
``observe_step`` the step's cost. Eligible: the request did not opt out, and its sampling
can be verified exactly — not beam search (beams are ranked, not sampled), not a grammar
(its matcher would have to follow every draft), not repetition/presence/frequency
penalties (each draft position would need its own penalty counts). Those requests decode
without speculation.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

from kvrelay_worker.engine.sched.sequence import Sequence, SequenceStatus
from kvrelay_worker.engine.spec.acceptance import Acceptance
from kvrelay_worker.engine.spec.ngram_index import NgramIndex
from kvrelay_worker.engine.spec.policy import (
    MIN_RATE,
    PROBE_EVERY,
    Candidate,
    choose_depths,
)
from kvrelay_worker.engine.spec.recent_outputs import RecentOutputs
from kvrelay_worker.engine.spec.step_time_curve import StepTimeCurve


class DraftSource(Protocol):
    """Proposes draft tokens for many sequences at once (a draft model)."""

    def propose(self, seqs: Seq[Sequence], depths: Seq[int]) -> list[list[int]]: ...

    def forget(self, seq: Sequence) -> None: ...


@dataclass
class SpeculationStats:
    proposed_tokens: int = 0  # drafts verified by the target
    accepted_tokens: int = 0
    verify_steps: int = 0  # sequence-verifications (one per speculating sequence per step)

    def as_dict(self) -> dict[str, float]:
        return {
            "spec_proposed_tokens": self.proposed_tokens,
            "spec_accepted_tokens": self.accepted_tokens,
            "spec_verify_steps": self.verify_steps,
            "spec_acceptance_rate": (self.accepted_tokens / self.proposed_tokens
                                     if self.proposed_tokens else 0.0),
            "spec_mean_accepted_length": (
                (self.accepted_tokens + self.verify_steps) / self.verify_steps
                if self.verify_steps else 0.0),
        }


@dataclass
class _Tracked:
    seq: Sequence
    acceptance: Acceptance
    index: NgramIndex | None
    skipped: int = 0


def speculation_allowed(seq: Sequence) -> bool:
    """Whether ``seq``'s sampling can be verified exactly (see the module docstring)."""
    p = seq.params
    return (p.speculative and not p.is_beam_search and seq.grammar is None
            and not p.needs_penalties)


class Speculator:
    """Proposes drafts (n-gram lookup or a draft model) and keeps acceptance statistics."""

    def __init__(self, *, max_drafts: int, ngram_min: int, ngram_max: int,
                 max_model_len: int, draft: DraftSource | None = None,
                 adaptive: bool = True) -> None:
        self.max_drafts = max_drafts
        self.adaptive = adaptive
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.max_model_len = max_model_len
        self.draft = draft
        self.recent = RecentOutputs(ngram_min, ngram_max)
        self.curve = StepTimeCurve()
        self.stats = SpeculationStats()
        self._tracked: dict[int, _Tracked] = {}
        self._drafted: list[Sequence] = []

    # ------------------------------------------------------------------ before a step

    def propose(self, running: Iterable[Sequence], prefill_tokens: int) -> None:
        """Set ``draft_token_ids`` on the running sequences that speculate this step."""
        for seq in self._drafted:
            seq.draft_token_ids = []
        self._drafted = []
        self._forget_finished()
        decoding = [s for s in running if s.status is SequenceStatus.RUNNING
                    and s.num_tokens - s.num_computed_tokens == 1]
        candidates: list[Candidate] = []
        proposals: dict[int, list[int]] = {}
        by_key: dict[int, Sequence] = {}
        for seq in decoding:
            limit = self._draft_limit(seq)
            if limit <= 0 or not speculation_allowed(seq):
                continue
            tracked = self._track(seq)
            if self.adaptive and tracked.acceptance.rate < MIN_RATE:
                tracked.skipped += 1
                if tracked.skipped < PROBE_EVERY:
                    continue
                tracked.skipped = 0
                limit = 1
            if self.draft is None:
                guess = self._lookup(seq, tracked, limit)
                if not guess:
                    continue
                proposals[seq.seq_id] = guess
                limit = len(guess)
            candidates.append(Candidate(seq.seq_id, limit, tracked.acceptance.rate))
            by_key[seq.seq_id] = seq
        if not candidates:
            return
        depths = (choose_depths(candidates, len(decoding) + prefill_tokens, len(decoding),
                                self.curve) if self.adaptive
                  else {c.key: c.max_drafts for c in candidates})
        for c in candidates:  # a rare probe, so an estimate that says "no" can be revised
            tracked = self._tracked[c.key]
            if depths.get(c.key, 0) > 0:
                tracked.skipped = 0
                continue
            tracked.skipped += 1
            if tracked.skipped >= PROBE_EVERY:
                tracked.skipped = 0
                depths[c.key] = 1
        chosen = [(by_key[key], n) for key, n in depths.items() if n > 0]
        if self.draft is not None and chosen:
            guesses = self.draft.propose([s for s, _ in chosen], [n for _, n in chosen])
            proposals = {s.seq_id: g for (s, _), g in zip(chosen, guesses, strict=True)}
        for seq, n in chosen:
            drafts = proposals.get(seq.seq_id, [])[:n]
            if drafts:
                seq.draft_token_ids = drafts
                self._drafted.append(seq)

    def _draft_limit(self, seq: Sequence) -> int:
        """Drafts that still fit before ``max_tokens`` and the context end (the target's
        own token comes after them)."""
        limit = min(self.max_drafts, self.max_model_len - seq.num_tokens - 1)
        max_tokens = seq.params.max_tokens
        if max_tokens is not None:
            limit = min(limit, max_tokens - seq.num_output_tokens - 1)
        return limit

    def _track(self, seq: Sequence) -> _Tracked:
        tracked = self._tracked.get(seq.seq_id)
        if tracked is None:
            index = (NgramIndex(self.ngram_min, self.ngram_max) if self.draft is None
                     else None)
            tracked = _Tracked(seq, Acceptance(), index)
            self._tracked[seq.seq_id] = tracked
        return tracked

    def _lookup(self, seq: Sequence, tracked: _Tracked, limit: int) -> list[int]:
        assert tracked.index is not None
        tokens = seq.token_ids
        own = tracked.index.propose(tokens, limit)
        return own or self.recent.propose(tokens, limit, seq.cache_salt)

    def _forget_finished(self) -> None:
        done = [key for key, t in self._tracked.items() if t.seq.is_finished]
        for key in done:
            seq = self._tracked.pop(key).seq
            if seq.status is not SequenceStatus.FINISHED_ABORTED and self.draft is None:
                self.recent.add(seq.output_token_ids, seq.cache_salt)
            if self.draft is not None:
                self.draft.forget(seq)

    # ------------------------------------------------------------------- after a step

    def verified(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """``seq`` verified ``proposed`` drafts and kept ``accepted`` of them."""
        self.stats.proposed_tokens += proposed
        self.stats.accepted_tokens += accepted
        self.stats.verify_steps += 1
        tracked = self._tracked.get(seq.seq_id)
        if tracked is not None:
            tracked.acceptance.observe(proposed, accepted)

    def observe_step(self, num_tokens: int, ms: float) -> None:
        self.curve.observe(num_tokens, ms)
