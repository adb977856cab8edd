"""A request's way in: checked, tokenized and turned into its ``RequestState``.

Everything ``add_request`` refuses is refused here, before anything is queued, so the
engine is left as it was; what comes out is ready for the scheduler.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import torch

from kvrelay.protocol import ToolCallDelta
from kvrelay_worker.engine.errors import InvalidPromptError, SamplingParamsError
from kvrelay_worker.engine.prior_choices import PriorChoices, status_of_reason
from kvrelay_worker.engine.prompt import Prompt, prompt_token_ids
from kvrelay_worker.engine.prompt_logprobs import PromptLogprobs
from kvrelay_worker.engine.request_state import ChoiceState, RequestState
from kvrelay_worker.engine.sample.grammar import GrammarCompiler
from kvrelay_worker.engine.sample.sampling_batch import build_sampling_batch
from kvrelay_worker.engine.sample.stop_conditions import StopConditions
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.sched.sequence import Sequence
from kvrelay_worker.engine.tools.choice_parsing import choice_output, resume_choice_output

if TYPE_CHECKING:
    from kvrelay_worker.engine.lora.adapter import LoraAdapter


class InputProcessor:
    """Turns ``add_request``'s arguments into a request's state, or refuses them."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...],
                 max_model_len: int, device: torch.device, stop: StopConditions) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.device = device
        self.stop = stop
        self.grammars = GrammarCompiler(tokenizer, vocab_size, eos_token_ids)
        self._arrivals = itertools.count()

    def process(self, request_id: str, prompt: Prompt, params: SamplingParams, *,
                priority: int = 0, cache_salt: str | None = None,
                prior_outputs: Seq[Seq[int]] | None = None,
                prior_texts: Seq[str] | None = None,
                prior_finish_reasons: Seq[str | None] | None = None,
                prior_reasoning: Seq[str] | None = None,
                prior_tool_calls: Seq[Seq[ToolCallDelta]] | None = None,
                lora: LoraAdapter | None = None) -> RequestState:
        """The request's state, each choice with its grammar matcher; raises on bad input
        (the arguments are ``LLMEngine.add_request``'s, ``lora`` its adapter resolved)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        prompt_ids = prompt_token_ids(prompt, self.tokenizer, self.vocab_size,
                                      self.max_model_len)
        self.check_sampling(params, prompt_ids)
        prior = PriorChoices.checked(prior_outputs, prior_texts, prior_finish_reasons,
                                      self.vocab_size, reasonings=prior_reasoning,
                                      tool_calls=prior_tool_calls)
        if params.reports_at_end and not prior.is_empty:
            raise InvalidPromptError("a best_of or beam search request cannot resume from "
                                     "prior outputs: its candidates were never reported; "
                                     "restart it")
        grammar = self.grammars.compile(params.response_format, params.tool_plan)
        state = self._new_request(request_id, prompt, prompt_ids, params, priority,
                                  cache_salt, prior, lora)
        if grammar is not None:  # a matcher per choice, through what it already sent
            for choice in state.choices:
                if choice.finish_reason is None:
                    choice.seq.grammar = self.grammars.matcher(
                        grammar, choice.seq.output_token_ids)
        return state

    def check_sampling(self, params: SamplingParams, prompt_ids: list[int]) -> None:
        """Refuse options the sampler could not apply, now rather than inside a step.

        The request's sampling row is built once, as a step would build it: a value that
        passes the type checks but breaks tensor building fails here, alone.
        """
        for t in params.stop_token_ids or ():
            if t >= self.vocab_size:
                raise InvalidPromptError(f"stop token id {t} is outside the vocabulary")
        probe = Sequence(request_id="", choice_index=0, token_ids=list(prompt_ids),
                         num_prompt_tokens=len(prompt_ids), params=params)
        try:
            build_sampling_batch([probe], self.vocab_size, self.eos_token_ids, self.device)
        except Exception as exc:
            raise SamplingParamsError(f"the sampling options cannot be applied: {exc}") from exc

    def _new_request(self, request_id: str, prompt: Prompt, prompt_ids: list[int],
                     params: SamplingParams, priority: int, cache_salt: str | None,
                     prior: PriorChoices, lora: LoraAdapter | None = None) -> RequestState:
        """The request's state: one sequence, detokenizer and finish per choice (per
        candidate with best_of; ``RequestState`` reports the winners)."""
        arrival = next(self._arrivals)
        choices: list[ChoiceState] = []
        for index in range(params.num_candidates):
            tokens = prior.tokens(index)
            seq = Sequence(request_id=request_id, choice_index=index,
                           token_ids=prompt_ids + tokens, num_prompt_tokens=len(prompt_ids),
                           params=params, priority=priority, arrival_order=arrival,
                           cache_salt=cache_salt, lora=lora)
            detok, parsing = choice_output(self.tokenizer, params, request_id, index,
                                           prompt_ids)
            if tokens:
                resume_choice_output(detok, parsing, tokens, prior.text(index),
                                     prior.reasoning(index), prior.calls(index))
            choice = ChoiceState(seq=seq, detok=detok, parsing=parsing,
                                 logprobs=[] if params.logprobs is not None else None,
                                 cumulative_logprob=(0.0 if params.needs_token_logprobs
                                                     and not tokens else None))
            # Choice 0 scores the prompt unless an earlier attempt already reported it.
            seq.scores_prompt = (index == 0 and params.prompt_logprobs is not None
                                 and not tokens and prior.finish_reason(index) is None)
            # ``max_tokens`` 0 asks for the prompt's scores alone: they are computed first.
            status = None if seq.scores_prompt else self.stop.length_status(seq)
            reason = prior.finish_reason(index) or (status.value if status else None)
            if reason is not None:
                choice.finish_reason = reason
                choice.reported_finish = True
                seq.status = status_of_reason(reason)
            choices.append(choice)
        return RequestState(request_id, prompt if isinstance(prompt, str) else None,
                            prompt_ids, choices, num_returned=params.n,
                            prompt_logprobs=(PromptLogprobs(len(prompt_ids))
                                             if choices[0].seq.scores_prompt else None))
