"""Beam search for one request: which beams continue, which hypotheses are finished.

The arithmetic is that of Hugging Face transformers' ``_beam_search`` (``do_sample=False``),
step for step and in float32, so the same logits pick the same tokens and scores:
``log_softmax`` of each beam's logits plus its running score; the top ``max(2, 1 + stop
ids) * width`` candidates over all beams; candidates that end (a stop id, or the length
limit) among the first ``width`` become finished hypotheses scored ``sum of logprobs /
generated length ** length_penalty`` (the length counts the stop token); the best
``width`` that did not end run on. The search ends when the best running beam cannot beat
the worst finished hypothesis (``early_stopping`` False: judged at the current length;
"never": at the longest possible one when the penalty is positive), when ``width``
hypotheses are finished and ``early_stopping`` is True, or when every candidate ended.
The engine owns the sequences and their blocks; this module only decides.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

# transformers' stand-in for "impossible": added to scores that must never win.
_NEVER = -1.0e9


@dataclass(frozen=True)
class BeamConfig:
    width: int
    length_penalty: float
    early_stopping: bool | str
    stop_ids: frozenset[int]
    # Output tokens a hypothesis may have at most (max_tokens, or what the context allows).
    max_new_tokens: int


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]
    score: float
    stopped: bool  # ended on a stop id (else on the length limit)


@dataclass(frozen=True)
class BeamStep:
    """The beams of the next step: beam ``i`` is ``parents[i]``'s tokens plus ``tokens[i]``."""

    parents: list[int]
    tokens: list[int]


class BeamSearch:
    """The state transformers keeps for one batch item: running and finished beams."""

    def __init__(self, config: BeamConfig) -> None:
        self.config = config
        k = config.width
        self.beams_to_keep = max(2, 1 + len(config.stop_ids)) * k
        # Before the first step one beam runs (the others would repeat it at -1e9).
        self.running_scores = torch.zeros(1, dtype=torch.float32)
        self.running_tokens: list[list[int]] = [[]]
        self.finished_scores = torch.full((k,), _NEVER, dtype=torch.float32)
        self.finished_tokens: list[list[int]] = [[] for _ in range(k)]
        self.is_finished = torch.zeros(k, dtype=torch.bool)
        self.done = False

    @property
    def num_running(self) -> int:
        return len(self.running_tokens)

    def step(self, log_probs: torch.Tensor) -> BeamStep | None:
        """Advance with ``log_probs`` ([running beams, vocab], float32 log_softmax of each
        running beam's next-token logits); the next beams, or None when the search ends."""
        width = min(self.beams_to_keep, log_probs.shape[-1])
        top = log_probs.float().topk(width, dim=-1)
        return self.step_top(top.values, top.indices)

    def step_top(self, values: torch.Tensor, token_ids: torch.Tensor) -> BeamStep | None:
        """``step`` from each running beam's best log-probabilities alone: ``values``
        (float32) and their ``token_ids``, ``[running beams, K]`` with ``K`` at least
        ``min(beams_to_keep, vocab)``. The best candidates over all beams are among each
        beam's own best (a beam's score shifts its row by one constant), so the engine
        reads back K per beam instead of the vocabulary. Ties rank by beam, then token."""
        if self.done:
            raise RuntimeError("the beam search is over")
        cfg = self.config
        k = cfg.width
        scores = (values.float().cpu() + self.running_scores[:, None]).reshape(-1)
        tokens_all = token_ids.cpu().reshape(-1)
        parents_all = torch.arange(values.shape[0]).repeat_interleave(values.shape[1])
        # Stable sorts, least significant key first: score (descending), beam, token.
        order = tokens_all.argsort(stable=True)
        order = order[parents_all[order].argsort(stable=True)]
        order = order[scores[order].sort(descending=True, stable=True).indices]
        order = order[: min(self.beams_to_keep, scores.numel())]
        top_scores = scores[order]
        parents = parents_all[order].tolist()
        tokens = tokens_all[order].tolist()
        length = len(self.running_tokens[0]) + 1  # output tokens of every candidate
        candidates = [self.running_tokens[p] + [t] for p, t in zip(parents, tokens, strict=True)]
        hits = torch.tensor([t in cfg.stop_ids or length >= cfg.max_new_tokens for t in tokens])

        # Running beams: the best k candidates that did not end.
        running = top_scores + hits.to(torch.float32) * _NEVER
        keep = torch.topk(running, k=min(k, running.numel())).indices
        self.running_scores = running[keep]
        self.running_tokens = [candidates[i] for i in keep.tolist()]

        # Finished hypotheses: candidates among the first k that ended, if they rank.
        in_top = torch.arange(len(tokens)) < k
        just_finished = hits & in_top
        finished = top_scores / (length**cfg.length_penalty)
        finished = finished + (~just_finished) * _NEVER
        merged_scores = torch.cat((self.finished_scores, finished))
        merged_tokens = self.finished_tokens + candidates
        merged_done = torch.cat((self.is_finished, just_finished))
        best = torch.topk(merged_scores, k=k).indices
        self.finished_scores = merged_scores[best]
        self.finished_tokens = [merged_tokens[i] for i in best.tolist()]
        self.is_finished = merged_done[best]

        if self._should_stop(length, bool(hits.all())):
            self.done = True
            return None
        return BeamStep(parents=[parents[i] for i in keep.tolist()],
                        tokens=[tokens[i] for i in keep.tolist()])

    def _should_stop(self, length: int, all_ended: bool) -> bool:
        cfg = self.config
        if cfg.early_stopping == "never" and cfg.length_penalty > 0.0:
            best_length = cfg.max_new_tokens
        else:
            best_length = length
        best_running = self.running_scores[:1] / (best_length**cfg.length_penalty)
        worst_finished = torch.where(self.is_finished, self.finished_scores.min(),
                                     torch.tensor(_NEVER))
        can_improve = bool((best_running > worst_finished).any())
        all_full = bool(self.is_finished.all()) and cfg.early_stopping is True
        return not can_improve or all_full or all_ended

    def best(self, n: int) -> list[Hypothesis]:
        """The ``n`` best finished hypotheses, best first (transformers' ``sequences`` and
        ``sequences_scores``)."""
        return [Hypothesis(tokens=self.finished_tokens[i],
                           score=float(self.finished_scores[i]),
                           stopped=bool(self.finished_tokens[i])
                           and self.finished_tokens[i][-1] in self.config.stop_ids)
                for i in range(n)]


def beam_config(width: int, length_penalty: float, early_stopping: bool | str,
                stop_ids: Collection[int], max_new_tokens: int) -> BeamConfig:
    return BeamConfig(width=width, length_penalty=length_penalty,
                      early_stopping=early_stopping, stop_ids=frozenset(stop_ids),
                      max_new_tokens=max_new_tokens)
