"""Vectorised sampling for a whole batch, every row with its own parameters.

Order of operations (per row): the grammar mask of a constrained row (structured
output), logit bias and min-tokens bans, then repetition /
presence / frequency penalties, then temperature; greedy rows take the argmax there.
Random rows then apply top-k, top-p and min-p (Hugging Face's order) and sample with an
exponential race (``argmax(p / E)``, ``E ~ Exp(1)``), which equals drawing from ``p``.
A seeded row draws its noise from a generator keyed by (seed, choice, position), so its
tokens depend only on those and the logits, whatever else shares the batch.
Log-probabilities are ``log_softmax`` of the processed logits (after penalties and
temperature, before top-k/top-p/min-p filtering).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvrelay_worker.engine.sample.grammar import apply_grammar_mask

_MASK64 = (1 << 64) - 1


def noise_seed(seed: int, choice: int, position: int) -> int:
    """Mix a request seed, its choice index and the output position into one 63-bit seed."""
    x = (seed & _MASK64) ^ (choice * 0x9E3779B97F4A7C15 & _MASK64) ^ (position * 0xBF58476D1CE4E5B9 & _MASK64)
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


@dataclass
class SamplingBatch:
    """Per-row sampling parameters for the rows of one step's logits."""

    all_greedy: bool
    # Only when some row samples at random: [N] float32 (1.0 on greedy rows), [N] bool.
    temperature: torch.Tensor | None = None
    greedy: torch.Tensor | None = None
    top_k: torch.Tensor | None = None  # [N] int64, vocab size where off
    top_p: torch.Tensor | None = None  # [N] float32, 1.0 where off
    min_p: torch.Tensor | None = None  # [N] float32, 0.0 where off
    repetition_penalty: torch.Tensor | None = None  # [N]
    presence_penalty: torch.Tensor | None = None  # [N]
    frequency_penalty: torch.Tensor | None = None  # [N]
    seen_mask: torch.Tensor | None = None  # [N, V] bool: in prompt or output
    output_counts: torch.Tensor | None = None  # [N, V] float32: occurrences in output
    bias_index: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows, token ids)
    bias_values: torch.Tensor | None = None
    ban_index: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows, token ids) -> -inf
    # (row, seed noise) for rows with a seed; other random rows use the engine generator.
    seeded_rows: tuple[tuple[int, int], ...] = ()
    # Largest number of top logprobs any row asked for; -1 when none asked.
    max_logprobs: int = -1
    # Structured output: packed [N, ceil(V/32)] int32 allowed-token bits, and its rows.
    grammar_bitmask: torch.Tensor | None = None
    grammar_rows: list[int] | None = None


@dataclass
class SamplerOutput:
    token_ids: list[int]
    # Only when some row asked for logprobs: [N] sampled token's logprob, [N, K] top-K.
    token_logprobs: list[float] | None = None
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None
    # Each beam search row's (``BatchLayout.beam_rows``) best log_softmax values and
    # their token ids (``[rows, K]``, on the host); set by the engine, which ranks beams
    # itself (engine/beam/beam_search.py).
    beam_log_probs: torch.Tensor | None = None
    beam_token_ids: torch.Tensor | None = None


def apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Bias, bans and penalties on float32 ``logits`` ([N, V]); returns a new tensor.

    Out of place: the model runner's logits are inference tensors (made under
    ``torch.inference_mode``), which may not be modified in place outside it.
    """
    if batch.bias_index is not None and batch.bias_values is not None:
        logits = logits.index_put(batch.bias_index, batch.bias_values, accumulate=True)
    if batch.repetition_penalty is not None and batch.seen_mask is not None:
        penalty = batch.repetition_penalty[:, None].expand_as(logits)
        penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
        logits = torch.where(batch.seen_mask, penalized, logits)
    if batch.output_counts is not None:
        counts = batch.output_counts
        if batch.frequency_penalty is not None:
            logits = logits - batch.frequency_penalty[:, None] * counts
        if batch.presence_penalty is not None:
            logits = logits - batch.presence_penalty[:, None] * (counts > 0).float()
    if batch.ban_index is not None:
        # new_full fills on the device; torch.tensor(..., device=) would copy from the host.
        logits = logits.index_put(batch.ban_index, logits.new_full((), float("-inf")))
    return logits


def apply_top_k_top_p_min_p(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k, nucleus and min-p sets."""
    if batch.top_k is not None or batch.top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        if batch.top_k is not None:
            kth = sorted_logits.gather(1, (batch.top_k - 1).clamp(min=0)[:, None])
            sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
        if batch.top_p is not None:
            probs = sorted_logits.softmax(dim=-1)
            before = probs.cumsum(dim=-1) - probs  # probability mass ranked above each token
            outside = before >= batch.top_p[:, None]
            outside[:, 0] = False
            sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
        logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    if batch.min_p is not None:
        probs = logits.softmax(dim=-1)
        floor = batch.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def _exponential_noise(shape: tuple[int, int], batch: SamplingBatch, device: torch.device,
                       generator: torch.Generator | None) -> torch.Tensor:
    noise = torch.empty(shape, device=device, dtype=torch.float32)
    noise.exponential_(generator=generator)
    for row, seed in batch.seeded_rows:
        row_gen = torch.Generator(device=device).manual_seed(seed)
        noise[row].exponential_(generator=row_gen)
    # A zero draw would divide by zero; the smallest normal float is as good as zero.
    return noise.clamp_(min=torch.finfo(torch.float32).tiny)


class Sampler:
    """Turns a step's logits into one token per row (plus logprobs when asked)."""

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        logits = logits.to(torch.float32)
        if batch.grammar_bitmask is not None and batch.grammar_rows:
            # First: -inf stays -inf through bias, penalties and temperature.
            logits = apply_grammar_mask(logits, batch.grammar_bitmask, batch.grammar_rows)
        logits = apply_penalties(logits, batch)
        if batch.all_greedy:
            processed = logits
            tokens = logits.argmax(dim=-1)
        else:
            assert batch.temperature is not None
            assert batch.greedy is not None
            processed = logits / batch.temperature[:, None]
            filtered = apply_top_k_top_p_min_p(processed, batch)
            probs = filtered.softmax(dim=-1)
            noise = _exponential_noise((probs.shape[0], probs.shape[1]), batch, probs.device,
                                       self.generator)
            sampled = (probs / noise).argmax(dim=-1)
            tokens = torch.where(batch.greedy, processed.argmax(dim=-1), sampled)
        if batch.max_logprobs < 0:
            return SamplerOutput(token_ids=tokens.tolist())
        return _with_logprobs(tokens, processed.log_softmax(dim=-1), batch.max_logprobs)


def _with_logprobs(tokens: torch.Tensor, logprobs: torch.Tensor, k: int) -> SamplerOutput:
    """Tokens, their logprobs and the top ``k`` of each row, read back in ONE copy.

    Each ``.tolist()`` of a device tensor is a copy to the host and a wait for the device;
    the four results travel together as one float64 table instead (token ids are exact
    in float64, and float32 logprobs convert exactly).
    """
    columns = [tokens[:, None].double(), logprobs.gather(1, tokens[:, None]).double()]
    if k > 0:
        top = logprobs.topk(k, dim=-1)
        columns += [top.indices.double(), top.values.double()]
    rows: list[list[float]] = torch.cat(columns, dim=1).tolist()
    return SamplerOutput(
        token_ids=[int(row[0]) for row in rows],
        token_logprobs=[row[1] for row in rows],
        top_ids=[[int(v) for v in row[2 : 2 + k]] for row in rows],
        top_logprobs=[row[2 + k :] for row in rows],
    )
