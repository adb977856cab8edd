"""Gather the per-row sampling tensors for the sequences that sample this step.

Everything is built on the host as small arrays and index tensors and sent with
``host_to_device`` (asynchronous on CUDA). What depends on a request alone (its
logit-bias entries, the tokens ``min_tokens`` bans) is built once per sequence and kept
until it finishes; the ``[N, V]`` penalty tables are gathered on the device from per-
sequence rows that each step updates with its new tokens only (``PenaltyState``).
A step's host work is then proportional to the batch, not to what its requests carry.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
import torch

from kvrelay_worker.engine.runner.transfer import host_to_device
from kvrelay_worker.engine.sample.grammar import GrammarMask
from kvrelay_worker.engine.sample.penalty_state import PenaltyState
from kvrelay_worker.engine.sample.sampler import SamplingBatch, noise_seed
from kvrelay_worker.engine.sched.sequence import Sequence


def _row_tensor(values: list[float], device: torch.device) -> torch.Tensor:
    return host_to_device(torch.tensor(values, dtype=torch.float32), device)


def _index_tensor(values: np.ndarray, device: torch.device) -> torch.Tensor:
    return host_to_device(torch.from_numpy(values), device)


@dataclass(frozen=True)
class RequestTokenTables:
    """A sequence's logit-bias entries and min-tokens bans, inside the vocabulary."""

    bias_ids: np.ndarray  # int64
    bias_values: np.ndarray  # float32
    ban_ids: np.ndarray  # int64: stop token ids, plus EOS unless ignore_eos

    @classmethod
    def of(cls, seq: Sequence, vocab_size: int, eos_token_ids: Seq[int]) -> RequestTokenTables:
        p = seq.params
        bias = [(t, v) for t, v in (p.logit_bias or {}).items() if t < vocab_size]
        banned = set(p.stop_token_ids or ())
        if not p.ignore_eos:
            banned.update(eos_token_ids)
        return cls(
            bias_ids=np.array([t for t, _ in bias], dtype=np.int64),
            bias_values=np.array([v for _, v in bias], dtype=np.float32),
            ban_ids=np.array(sorted(t for t in banned if t < vocab_size), dtype=np.int64),
        )


class SamplingBatchBuilder:
    """Builds each step's ``SamplingBatch``, keeping per-sequence state between steps."""

    def __init__(self, vocab_size: int, eos_token_ids: Seq[int], device: torch.device,
                 penalty_rows: int = 16) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.device = device
        # Lazily: most batches use no penalty, and the tables are [rows, vocab].
        self._penalty_rows = penalty_rows
        self._penalties: PenaltyState | None = None
        self._tables: dict[int, tuple[Sequence, RequestTokenTables]] = {}
        self._grammar_mask = GrammarMask(vocab_size)

    @property
    def penalties(self) -> PenaltyState:
        if self._penalties is None:
            self._penalties = PenaltyState(self.vocab_size, self.device, self._penalty_rows)
        return self._penalties

    @property
    def num_tracked(self) -> int:
        """Sequences holding per-request state (tables or penalty rows)."""
        penalty_rows = self._penalties.num_tracked if self._penalties is not None else 0
        return len(self._tables) + penalty_rows

    def build(self, seqs: Seq[Sequence], offsets: Seq[int] | None = None) -> SamplingBatch:
        """One row per sequence, in order; tensors for unused features stay ``None``.

        ``offsets[row]`` > 0 makes a row sample as if that many more output tokens came
        before it (speculative decoding's rows after draft tokens): its seeded noise and
        ``min_tokens`` ban follow that position. Such rows carry no penalty or grammar.
        """
        self._release_finished()
        shift = list(offsets) if offsets is not None else [0] * len(seqs)
        params = [s.params for s in seqs]
        greedy = [p.greedy for p in params]
        device = self.device
        batch = SamplingBatch(all_greedy=all(greedy))
        if not batch.all_greedy:
            batch.temperature = _row_tensor(
                [1.0 if g else p.temperature for g, p in zip(greedy, params)], device)
            batch.greedy = host_to_device(torch.tensor(greedy, dtype=torch.bool), device)
            if any(p.effective_top_k for p in params):
                batch.top_k = host_to_device(
                    torch.tensor([p.effective_top_k or self.vocab_size for p in params],
                                 dtype=torch.int64).clamp_(max=self.vocab_size),
                    device)
            if any(p.top_p < 1.0 for p in params):
                batch.top_p = _row_tensor([p.top_p for p in params], device)
            if any(p.min_p > 0.0 for p in params):
                batch.min_p = _row_tensor([p.min_p for p in params], device)
            batch.seeded_rows = tuple(
                (row, noise_seed(s.params.seed, s.choice_index,
                                 s.num_output_tokens + shift[row]))
                for row, s in enumerate(seqs)
                if s.params.seed is not None and not s.params.greedy
            )
        if any(p.needs_penalties for p in params):
            self._add_penalties(batch, seqs)
        self._add_bias_and_bans(batch, seqs, shift)
        constrained = [(row, s.grammar) for row, s in enumerate(seqs) if s.grammar is not None]
        if constrained:
            batch.grammar_bitmask, batch.grammar_rows = self._grammar_mask.fill(
                constrained, len(seqs), device)
        # Rows that rank best_of candidates need their sampled token's logprob (K = 0).
        asked = [p.logprobs or 0 for p in params if p.needs_token_logprobs]
        batch.max_logprobs = max(asked) if asked else -1
        return batch

    def _release_finished(self) -> None:
        if self._penalties is not None:
            self._penalties.release_finished()
        done = [key for key, (seq, _) in self._tables.items() if seq.is_finished]
        for key in done:
            del self._tables[key]

    def _add_penalties(self, batch: SamplingBatch, seqs: Seq[Sequence]) -> None:
        params = [s.params for s in seqs]
        device = self.device
        rows = self.penalties.rows_for(seqs, [p.needs_penalties for p in params])
        if any(p.repetition_penalty != 1.0 for p in params):
            batch.repetition_penalty = _row_tensor([p.repetition_penalty for p in params],
                                                   device)
            seen_rows = [r if p.repetition_penalty != 1.0 else 0 for r, p in zip(rows, params)]
            batch.seen_mask = self.penalties.seen.index_select(
                0, host_to_device(torch.tensor(seen_rows, dtype=torch.int64), device))
        if any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params):
            batch.presence_penalty = _row_tensor([p.presence_penalty for p in params], device)
            batch.frequency_penalty = _row_tensor([p.frequency_penalty for p in params], device)
            count_rows = [r if p.presence_penalty or p.frequency_penalty else 0
                          for r, p in zip(rows, params)]
            batch.output_counts = self.penalties.counts.index_select(
                0, host_to_device(torch.tensor(count_rows, dtype=torch.int64), device))

    def _tables_of(self, seq: Sequence) -> RequestTokenTables:
        entry = self._tables.get(seq.seq_id)
        if entry is None:
            entry = (seq, RequestTokenTables.of(seq, self.vocab_size, self.eos_token_ids))
            self._tables[seq.seq_id] = entry
        return entry[1]

    def _add_bias_and_bans(self, batch: SamplingBatch, seqs: Seq[Sequence],
                           shift: Seq[int]) -> None:
        bias: list[tuple[int, RequestTokenTables]] = []
        bans: list[tuple[int, RequestTokenTables]] = []
        for row, s in enumerate(seqs):
            p = s.params
            # A grammar alone decides where a constrained row may end (EOS included).
            banning = s.num_output_tokens + shift[row] < p.min_tokens and s.grammar is None
            if not p.logit_bias and not banning:
                continue
            tables = self._tables_of(s)
            if tables.bias_ids.size:
                bias.append((row, tables))
            if banning and tables.ban_ids.size:
                bans.append((row, tables))
        if bias:
            batch.bias_index = self._index_pairs([(r, t.bias_ids) for r, t in bias])
            values = np.concatenate([t.bias_values for _, t in bias])
            batch.bias_values = host_to_device(torch.from_numpy(values), self.device)
        if bans:
            batch.ban_index = self._index_pairs([(r, t.ban_ids) for r, t in bans])

    def _index_pairs(self, per_row: list[tuple[int, np.ndarray]]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, token ids) index tensors: each row repeated once per token of its array."""
        rows = np.repeat(np.array([r for r, _ in per_row], dtype=np.int64),
                         [ids.size for _, ids in per_row])
        ids = np.concatenate([ids for _, ids in per_row])
        return _index_tensor(rows, self.device), _index_tensor(ids, self.device)


def build_sampling_batch(seqs: Seq[Sequence], vocab_size: int, eos_token_ids: Seq[int],
                         device: torch.device) -> SamplingBatch:
    """A one-off batch (a fresh builder, no state kept): what tests and tools need."""
    builder = SamplingBatchBuilder(vocab_size, eos_token_ids, device, len(seqs) + 1)
    return builder.build(seqs)
