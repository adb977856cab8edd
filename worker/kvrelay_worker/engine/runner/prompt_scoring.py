"""Log-probabilities of prompt tokens (``prompt_logprobs``), from a step's hidden states.

The model runner gives the LM head only the sampling rows of a step; a chunk of a prompt
whose log-probabilities are asked also sends its positions here. The logits at position
``p`` score prompt token ``p + 1`` under the model's raw distribution: ``log_softmax`` in
float32 of the logits as the model gives them (no temperature, penalty or bias, as
OpenAI's ``echo`` and vLLM's ``prompt_logprobs`` report them).

Rows go through the LM head in slices, so a long chunk never holds ``chunk x vocab``
logits at once; each slice is read back to the host in one copy.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from kvrelay_worker.engine.sched.scheduler_output import PromptSpan
from kvrelay_worker.engine.sched.sequence import Sequence
from kvrelay_worker.models.decoder import CausalLM

# Rows per LM-head slice: 256 x a 128k vocabulary is 128 MiB of float32 logits.
ROWS_PER_SLICE = 256


@dataclass
class PromptScores:
    """One chunk's scored positions: entry ``i`` is prompt token ``first_token + i``."""

    seq: Sequence
    first_token: int
    token_ids: list[int]
    logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]


def score_prompt_spans(model: CausalLM, hidden: torch.Tensor,
                       spans: Seq[PromptSpan]) -> list[PromptScores]:
    """Score every span's positions from ``hidden`` (the step's ``[tokens, hidden]``)."""
    live = [span for span in spans if span.count]
    if not live:
        return []
    rows: list[int] = []
    targets: list[int] = []
    for span in live:
        rows.extend(range(span.flat_start, span.flat_start + span.count))
        targets.extend(span.targets)
    k = max(span.item.seq.params.prompt_logprobs or 0 for span in live)
    device = hidden.device
    row_index = torch.tensor(rows, dtype=torch.int64, device=device)
    target_index = torch.tensor(targets, dtype=torch.int64, device=device)
    table: list[list[float]] = []
    for start in range(0, len(rows), ROWS_PER_SLICE):
        end = start + ROWS_PER_SLICE
        logits = model.compute_logits(hidden[row_index[start:end]]).float()
        logprobs = logits.log_softmax(dim=-1)
        columns = [logprobs.gather(1, target_index[start:end, None]).double()]
        if k > 0:
            top = logprobs.topk(k, dim=-1)
            columns += [top.indices.double(), top.values.double()]
        table.extend(torch.cat(columns, dim=1).tolist())
    scores: list[PromptScores] = []
    offset = 0
    for span in live:
        seq = span.item.seq
        n, want = span.count, seq.params.prompt_logprobs or 0
        part = table[offset : offset + n]
        scores.append(PromptScores(
            seq=seq,
            first_token=span.first_position + 1,
            token_ids=targets[offset : offset + n],
            logprobs=[row[0] for row in part],
            top_ids=[[int(v) for v in row[1 : 1 + want]] for row in part],
            top_logprobs=[row[1 + k : 1 + k + want] for row in part],
        ))
        offset += n
    return scores
