"""What one step runs, and which rows of its logits belong to which sequence.

The row layout is worked out once, when the scheduler finishes a batch
(``BatchLayout.of``), and read by everything after it: the model runner gathers the
logits of those token positions, the sampling batch gives each row its sequence's
parameters, and ``Scheduler.update_from_output`` hands each sequence its rows' tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvrelay_worker.engine.sched.sequence import Sequence
from kvrelay_worker.engine.sched.step_cost import StepShape


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


@dataclass
class PromptSpan:
    """A scheduled prompt chunk whose positions are scored (``prompt_logprobs``).

    The logits at position ``p`` give the log-probability of prompt token ``p + 1``, so
    the chunk's positions before the prompt's last one are scored: ``count`` rows from
    ``flat_start`` (the chunk's first token among the batch's flattened tokens).
    """

    item: ScheduledSequence
    flat_start: int

    @property
    def first_position(self) -> int:
        return self.item.seq.num_computed_tokens

    @property
    def count(self) -> int:
        seq = self.item.seq
        end = min(seq.num_computed_tokens + self.item.num_new_tokens, seq.num_prompt_tokens - 1)
        return max(0, end - seq.num_computed_tokens)

    @property
    def targets(self) -> list[int]:
        """The prompt tokens the scored positions predict."""
        start = self.first_position + 1
        return self.item.seq.token_ids[start : start + self.count]


@dataclass(eq=False)
class BatchLayout:
    """A batch and its sampling rows: each item that samples owns ``len(drafts) + 1``
    consecutive rows (one per draft position, then its own next token), in batch order.

    Plain lists, built in one pass over the batch: this runs every step.
    """

    scheduled: list[ScheduledSequence]
    sampling: list[ScheduledSequence]  # the items that sample, in row order
    first_rows: list[int]  # each sampling item's first row
    row_seqs: list[Sequence]  # the sequence each row samples for
    # Per row: output tokens before it beyond its sequence's own (the drafts it follows).
    row_offsets: list[int]
    token_indices: list[int]  # per row: its position among the batch's flattened tokens
    beam_rows: list[int]  # rows of beam-search sequences (a beam never verifies drafts)
    # Chunks of prompts whose log-probabilities are asked (``Sequence.scores_prompt``).
    prompt_spans: list[PromptSpan] = field(default_factory=list)
    # Items that reach the end of their prompt and sample nothing (``max_tokens`` 0):
    # the scheduler finishes them once the step is applied.
    prompt_only: list[ScheduledSequence] = field(default_factory=list)

    @classmethod
    def of(cls, scheduled: list[ScheduledSequence]) -> BatchLayout:
        sampling: list[ScheduledSequence] = []
        first_rows: list[int] = []
        row_seqs: list[Sequence] = []
        row_offsets: list[int] = []
        token_indices: list[int] = []
        beam_rows: list[int] = []
        prompt_spans: list[PromptSpan] = []
        prompt_only: list[ScheduledSequence] = []
        end = 0
        for item in scheduled:
            end += item.num_new_tokens
            seq = item.seq
            if seq.scores_prompt:
                prompt_spans.append(PromptSpan(item, end - item.num_new_tokens))
            if not item.samples:
                continue
            if seq.params.max_tokens == 0:
                prompt_only.append(item)
                continue
            num_rows = len(item.drafts) + 1
            if seq.params.is_beam_search:
                beam_rows.append(len(row_seqs))
            sampling.append(item)
            first_rows.append(len(row_seqs))
            if num_rows == 1:  # a decode or a prompt's last chunk: the common case
                row_seqs.append(seq)
                row_offsets.append(0)
                token_indices.append(end - 1)
            else:
                row_seqs.extend([seq] * num_rows)
                row_offsets.extend(range(num_rows))
                token_indices.extend(range(end - num_rows, end))
        return cls(scheduled, sampling, first_rows, row_seqs, row_offsets, token_indices,
                   beam_rows, prompt_spans, prompt_only)

    @property
    def num_rows(self) -> int:
        return len(self.row_seqs)


@dataclass
class StepUpdate:
    """What ``Scheduler.update_from_output`` appended, per item of ``layout.sampling``:
    ``appended[i]`` tokens (its accepted drafts, then its sampled token, up to the one
    that finished it; 0 for a beam, which its beam group advances) after verifying
    ``accepted[i]`` of its drafts. Their tokens are the rows from ``first_rows[i]`` on."""

    appended: list[int]
    accepted: list[int]


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
    # What the step computes, for the cost model, and its sampling rows (set once the
    # batch is final).
    shape: StepShape = field(default_factory=StepShape)
    layout: BatchLayout = field(default_factory=lambda: BatchLayout.of([]))

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
