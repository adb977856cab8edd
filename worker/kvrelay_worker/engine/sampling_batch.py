"""Gather the per-row sampling tensors for the sequences that sample this step."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from kvrelay_worker.engine.sampler import SamplingBatch, noise_seed
from kvrelay_worker.engine.sequence import Sequence


def _row_tensor(values: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)


def build_sampling_batch(seqs: Seq[Sequence], vocab_size: int, eos_token_ids: Seq[int],
                         device: torch.device) -> SamplingBatch:
    """One row per sequence, in order; tensors for unused features stay ``None``."""
    params = [s.params for s in seqs]
    greedy = [p.greedy for p in params]
    batch = SamplingBatch(all_greedy=all(greedy))
    if not batch.all_greedy:
        batch.temperature = _row_tensor(
            [1.0 if g else p.temperature for g, p in zip(greedy, params)], device)
        batch.greedy = torch.tensor(greedy, dtype=torch.bool, device=device)
        if any(p.effective_top_k for p in params):
            batch.top_k = torch.tensor(
                [p.effective_top_k or vocab_size for p in params], dtype=torch.int64, device=device
            ).clamp_(max=vocab_size)
        if any(p.top_p < 1.0 for p in params):
            batch.top_p = _row_tensor([p.top_p for p in params], device)
        if any(p.min_p > 0.0 for p in params):
            batch.min_p = _row_tensor([p.min_p for p in params], device)
        batch.seeded_rows = tuple(
            (row, noise_seed(s.params.seed, s.choice_index, s.num_output_tokens))
            for row, s in enumerate(seqs)
            if s.params.seed is not None and not s.params.greedy
        )
    _add_penalties(batch, seqs, vocab_size, device)
    _add_bias_and_bans(batch, seqs, vocab_size, eos_token_ids, device)
    asked = [p.logprobs for p in params if p.logprobs is not None]
    batch.max_logprobs = max(asked) if asked else -1
    return batch


def _add_penalties(batch: SamplingBatch, seqs: Seq[Sequence], vocab_size: int,
                   device: torch.device) -> None:
    params = [s.params for s in seqs]
    if any(p.repetition_penalty != 1.0 for p in params):
        batch.repetition_penalty = _row_tensor([p.repetition_penalty for p in params], device)
        mask = torch.zeros((len(seqs), vocab_size), dtype=torch.bool)
        for row, s in enumerate(seqs):
            if s.params.repetition_penalty != 1.0:
                mask[row, torch.tensor(s.token_ids, dtype=torch.int64)] = True
        batch.seen_mask = mask.to(device)
    if any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params):
        batch.presence_penalty = _row_tensor([p.presence_penalty for p in params], device)
        batch.frequency_penalty = _row_tensor([p.frequency_penalty for p in params], device)
        counts = torch.zeros((len(seqs), vocab_size), dtype=torch.float32)
        for row, s in enumerate(seqs):
            out = s.output_token_ids
            if out and (s.params.presence_penalty or s.params.frequency_penalty):
                counts[row] = torch.bincount(torch.tensor(out, dtype=torch.int64),
                                             minlength=vocab_size)[:vocab_size].float()
        batch.output_counts = counts.to(device)


def _add_bias_and_bans(batch: SamplingBatch, seqs: Seq[Sequence], vocab_size: int,
                       eos_token_ids: Seq[int], device: torch.device) -> None:
    bias_rows: list[int] = []
    bias_ids: list[int] = []
    bias_values: list[float] = []
    ban_rows: list[int] = []
    ban_ids: list[int] = []
    for row, s in enumerate(seqs):
        p = s.params
        if p.logit_bias:
            for token, value in p.logit_bias.items():
                if token < vocab_size:
                    bias_rows.append(row)
                    bias_ids.append(token)
                    bias_values.append(value)
        if s.num_output_tokens < p.min_tokens:
            banned = set(p.stop_token_ids or ())
            if not p.ignore_eos:
                banned.update(eos_token_ids)
            for token in banned:
                if token < vocab_size:
                    ban_rows.append(row)
                    ban_ids.append(token)
    if bias_rows:
        batch.bias_index = (torch.tensor(bias_rows, device=device),
                            torch.tensor(bias_ids, device=device))
        batch.bias_values = _row_tensor(bias_values, device)
    if ban_rows:
        batch.ban_index = (torch.tensor(ban_rows, device=device),
                           torch.tensor(ban_ids, device=device))
