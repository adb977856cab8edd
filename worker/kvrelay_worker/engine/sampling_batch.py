"""Gather the per-row sampling tensors for the sequences that sample this step.

Everything is built on the host as small lists and index tensors and sent with
``host_to_device`` (asynchronous on CUDA); the ``[N, V]`` penalty tensors are allocated
on the device and filled there by scattering, never built at full size on the host.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq

import numpy as np
import torch

from kvrelay_worker.engine.sampler import SamplingBatch, noise_seed
from kvrelay_worker.engine.sequence import Sequence
from kvrelay_worker.engine.transfer import host_to_device


def _row_tensor(values: list[float], device: torch.device) -> torch.Tensor:
    return host_to_device(torch.tensor(values, dtype=torch.float32), device)


def _index_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    return host_to_device(torch.tensor(values, dtype=torch.int64), device)


def _token_index(rows: list[int], tokens: list[list[int]], device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token id) pairs, one per entry of ``tokens[i]`` (which belong to ``rows[i]``)."""
    lengths = [len(t) for t in tokens]
    total = sum(lengths)
    ids = np.fromiter(itertools.chain.from_iterable(tokens), dtype=np.int64, count=total)
    row_ids = np.repeat(np.asarray(rows, dtype=np.int64), lengths)
    return (host_to_device(torch.from_numpy(row_ids), device),
            host_to_device(torch.from_numpy(ids), device))


def build_sampling_batch(seqs: Seq[Sequence], vocab_size: int, eos_token_ids: Seq[int],
                         device: torch.device) -> SamplingBatch:
    """One row per sequence, in order; tensors for unused features stay ``None``."""
    params = [s.params for s in seqs]
    greedy = [p.greedy for p in params]
    batch = SamplingBatch(all_greedy=all(greedy))
    if not batch.all_greedy:
        batch.temperature = _row_tensor(
            [1.0 if g else p.temperature for g, p in zip(greedy, params)], device)
        batch.greedy = host_to_device(torch.tensor(greedy, dtype=torch.bool), device)
        if any(p.effective_top_k for p in params):
            batch.top_k = host_to_device(
                torch.tensor([p.effective_top_k or vocab_size for p in params],
                             dtype=torch.int64).clamp_(max=vocab_size),
                device)
        if any(p.top_p < 1.0 for p in params):
            batch.top_p = _row_tensor([p.top_p for p in params], device)
        if any(p.min_p > 0.0 for p in params):
            batch.min_p = _row_tensor([p.min_p for p in params], device)
        batch.seeded_rows = tuple(
            (row, noise_seed(s.params.seed, s.choice_index, s.num_output_tokens))
            for row, s in enumerate(seqs)
            if s.params.seed is not None and not s.params.greedy
        )
    if any(p.needs_penalties for p in params):
        _add_penalties(batch, seqs, vocab_size, device)
    _add_bias_and_bans(batch, seqs, vocab_size, eos_token_ids, device)
    asked = [p.logprobs for p in params if p.logprobs is not None]
    batch.max_logprobs = max(asked) if asked else -1
    return batch


def _add_penalties(batch: SamplingBatch, seqs: Seq[Sequence], vocab_size: int,
                   device: torch.device) -> None:
    params = [s.params for s in seqs]
    shape = (len(seqs), vocab_size)
    if any(p.repetition_penalty != 1.0 for p in params):
        batch.repetition_penalty = _row_tensor([p.repetition_penalty for p in params], device)
        rows = [row for row, p in enumerate(params) if p.repetition_penalty != 1.0]
        row_ids, token_ids = _token_index(rows, [seqs[row].token_ids for row in rows], device)
        mask = torch.zeros(shape, dtype=torch.bool, device=device)
        mask[row_ids, token_ids] = True
        batch.seen_mask = mask
    if any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params):
        batch.presence_penalty = _row_tensor([p.presence_penalty for p in params], device)
        batch.frequency_penalty = _row_tensor([p.frequency_penalty for p in params], device)
        rows = [row for row, s in enumerate(seqs)
                if s.num_output_tokens and (s.params.presence_penalty
                                            or s.params.frequency_penalty)]
        counts = torch.zeros(shape, dtype=torch.float32, device=device)
        if rows:  # none before the first output token
            row_ids, token_ids = _token_index(rows, [seqs[row].output_token_ids for row in rows],
                                              device)
            ones = torch.ones(token_ids.shape, dtype=torch.float32, device=device)
            counts.index_put_((row_ids, token_ids), ones, accumulate=True)
        batch.output_counts = counts


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
        batch.bias_index = (_index_tensor(bias_rows, device), _index_tensor(bias_ids, device))
        batch.bias_values = _row_tensor(bias_values, device)
    if ban_rows:
        batch.ban_index = (_index_tensor(ban_rows, device), _index_tensor(ban_ids, device))
