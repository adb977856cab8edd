"""A beam-search request inside the engine: its beams' sequences and the search deciding.

The request starts as one sequence (beam 0). Each beam's next-token distribution is kept
when the step that computed it ends; once every running beam has one (normally the same
step: beams are scheduled, preempted and admitted together), the search picks the next
beams and the scheduler reseats the sequences: beam ``i`` takes its parent's tokens plus
one, sharing the parent's blocks (copy-on-write). The first such step forks beam 0 into
``width`` sequences. When the search ends, every beam is finished and the best ``n``
hypotheses become the request's choices, reported whole, best first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kvrelay_worker.engine.beam.beam_scheduling import reseat_beams
from kvrelay_worker.engine.beam.beam_search import BeamConfig, BeamSearch, Hypothesis
from kvrelay_worker.engine.request_state import ChoiceState, RequestState
from kvrelay_worker.engine.sched.scheduler import Scheduler
from kvrelay_worker.engine.sched.scheduler_output import BatchLayout
from kvrelay_worker.engine.sched.sequence import Sequence, SequenceStatus
from kvrelay_worker.engine.tools.choice_parsing import choice_output

if TYPE_CHECKING:
    from kvrelay_worker.engine.sample.sampler import SamplerOutput


def beam_config_of(seq: Sequence, eos_token_ids: tuple[int, ...], max_model_len: int
                   ) -> BeamConfig:
    """The search's rules for ``seq``'s request: its stop ids (EOS unless ignored, then its
    stop tokens, as transformers' ``eos_token_id`` list) and output length limit."""
    p = seq.params
    stop_ids = set(p.stop_token_ids or ())
    if not p.ignore_eos:
        stop_ids.update(eos_token_ids)
    limit = max_model_len - seq.num_prompt_tokens
    if p.max_tokens is not None:
        limit = min(limit, p.max_tokens)
    return BeamConfig(width=p.beam_width, length_penalty=p.length_penalty,
                      early_stopping=p.early_stopping, stop_ids=frozenset(stop_ids),
                      max_new_tokens=max(limit, 1))


def beam_candidates(logits: torch.Tensor, per_beam: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each beam row's ``per_beam`` best log_softmax values (float32) and their token ids,
    taken on the logits' device and read back in ONE copy of ``[rows, 2 * per_beam]``
    (float64 holds both the float32 values and the ids exactly), not the vocabulary."""
    log_probs = logits.float().log_softmax(dim=-1)
    top = log_probs.topk(min(per_beam, log_probs.shape[-1]), dim=-1)
    width = top.values.shape[-1]
    host = torch.cat((top.values.double(), top.indices.double()), dim=-1).cpu()
    return host[:, :width].float(), host[:, width:].long()


class BeamGroup:
    """The beams of one request and the log-probabilities gathered for the next choice."""

    def __init__(self, state: RequestState, config: BeamConfig) -> None:
        self.state = state
        self.search = BeamSearch(config)
        self.beams: list[Sequence] = [state.choices[0].seq]
        self._rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def candidates_per_beam(self) -> int:
        """How many of each beam's best tokens a search step needs (at most; ``step_top``)."""
        return self.search.beams_to_keep

    def add_row(self, seq: Sequence, values: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Keep a beam's best next-token log-probabilities and their token ids, at least
        ``candidates_per_beam`` of them (a recompute may give them again)."""
        self._rows[self.beams.index(seq)] = (values, token_ids)

    @property
    def ready(self) -> bool:
        return len(self._rows) == len(self.beams)

    def advance(self, scheduler: Scheduler, tokenizer: Any) -> None:
        """Run one search step on the gathered rows; reseat the beams or finish."""
        rows = [self._rows[i] for i in range(len(self.beams))]
        self._rows = {}
        step = self.search.step_top(torch.stack([v for v, _ in rows]),
                                    torch.stack([t for _, t in rows]))
        if step is None:
            self._finish(scheduler, tokenizer)
            return
        while len(self.beams) < len(step.parents):
            self._fork()
        reseat_beams(scheduler, self.beams, step.parents, step.tokens)

    def _fork(self) -> None:
        first = self.beams[0]
        seq = Sequence(request_id=first.request_id, choice_index=len(self.beams),
                       token_ids=[], num_prompt_tokens=first.num_prompt_tokens,
                       params=first.params, priority=first.priority,
                       arrival_order=first.arrival_order, cache_salt=first.cache_salt,
                       lora=first.lora)
        seq.num_cached_tokens = first.num_cached_tokens
        self.beams.append(seq)
        # A choice per beam, so an abort or a failure finishes (frees) every beam.
        self.state.choices.append(ChoiceState(seq=seq, detok=self.state.choices[0].detok,
                                              logprobs=None))

    def _finish(self, scheduler: Scheduler, tokenizer: Any) -> None:
        for beam in self.beams:
            scheduler.finish(beam, SequenceStatus.FINISHED_STOPPED)
        n = self.beams[0].params.n
        self.state.choices = [self._choice(rank, h, tokenizer)
                              for rank, h in enumerate(self.search.best(n))]

    def _choice(self, rank: int, hyp: Hypothesis, tokenizer: Any) -> ChoiceState:
        first = self.beams[0]
        prompt = self.state.prompt_token_ids
        status = SequenceStatus.FINISHED_STOPPED if hyp.stopped else SequenceStatus.FINISHED_LENGTH
        seq = Sequence(request_id=first.request_id, choice_index=rank,
                       token_ids=[*prompt, *hyp.tokens], num_prompt_tokens=len(prompt),
                       params=first.params, status=status)
        seq.num_cached_tokens = first.num_cached_tokens
        detok, parsing = choice_output(tokenizer, first.params, first.request_id, rank,
                                       prompt, watch_stops=False)
        for token in hyp.tokens:
            detok.add_token(token)
        return ChoiceState(seq=seq, detok=detok, logprobs=None, new_ids=list(hyp.tokens),
                           finish_reason=status.value, beam_score=hyp.score, parsing=parsing)


def advance_beams(groups: dict[str, BeamGroup], layout: BatchLayout, result: SamplerOutput,
                  scheduler: Scheduler, tokenizer: Any) -> list[BeamGroup]:
    """Hand each beam its row of ``result``; step every beam search whose beams all have
    one, and return those groups (their requests have news)."""
    assert result.beam_log_probs is not None
    assert result.beam_token_ids is not None
    ready: list[BeamGroup] = []
    for i, row in enumerate(layout.beam_rows):
        beam = layout.row_seqs[row]
        group = groups[beam.request_id]
        group.add_row(beam, result.beam_log_probs[i], result.beam_token_ids[i])
        if group.ready and group not in ready:
            ready.append(group)
    for group in ready:
        group.advance(scheduler, tokenizer)
    return ready
