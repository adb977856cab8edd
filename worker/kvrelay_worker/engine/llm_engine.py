"""The engine: ``add_request``, ``abort_request``, ``step()``; the only door the worker uses.

Single-threaded by design: one thread calls these methods (the worker's engine thread
serialises requests from task threads into it). Each ``step()`` schedules a batch, runs
the model once, samples one token for every sequence that reached its end, and reports
what each touched request produced.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq
from typing import Any

from kvrelay_worker.engine.beam_group import BeamGroup, beam_candidates, beam_config_of
from kvrelay_worker.engine.block_copy import copy_blocks
from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.device import bind_device
from kvrelay_worker.engine.device_errors import is_sticky_device_error
from kvrelay_worker.engine.engine_model import build_model_for
from kvrelay_worker.engine.engine_parts import build_engine_parts
from kvrelay_worker.engine.engine_stats import engine_stats
from kvrelay_worker.engine.errors import RequestFailedError
from kvrelay_worker.engine.kv_swap import copy_to_device, copy_to_host
from kvrelay_worker.engine.max_model_len import default_max_len
from kvrelay_worker.engine.outputs import SampledLogprob, StepOutput
from kvrelay_worker.engine.prompt import Prompt
from kvrelay_worker.engine.request_state import ChoiceState, RequestState
from kvrelay_worker.engine.sampler import SamplerOutput
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.scheduler import ScheduledSequence
from kvrelay_worker.engine.sequence import Sequence, SequenceStatus
from kvrelay_worker.engine.speculative.verification import accepted_length
from kvrelay_worker.models.decoder import CausalLM

log = logging.getLogger(__name__)


class LLMEngine:
    """Continuous-batching inference over a paged KV cache for one model."""

    def __init__(self, config: EngineConfig, *, progress: bool = False) -> None:
        from kvrelay_worker.loading import load_model_source

        bind_device(config.torch_device)  # before any weight, stream or graph exists
        files = load_model_source(config.model, progress=progress)
        max_len = default_max_len(config, files.config.max_position_embeddings)
        model = build_model_for(config, files, max_len)
        self._setup(config, model, files.tokenizer, model_id=files.name)

    @classmethod
    def from_model(cls, config: EngineConfig, model: CausalLM, tokenizer: Any,
                   model_id: str = "custom", *,
                   draft_model: CausalLM | None = None) -> LLMEngine:
        """An engine around an already built model (random-weight benchmarks, tests);
        ``draft_model`` is the draft when ``config.speculative`` is ``draft:...``."""
        engine = cls.__new__(cls)
        engine._setup(config, model, tokenizer, model_id, draft_model)
        return engine

    def _setup(self, config: EngineConfig, model: CausalLM, tokenizer: Any,
               model_id: str, draft_model: CausalLM | None = None) -> None:
        bind_device(config.torch_device)
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.device = config.torch_device
        self.vocab_size = model.config.vocab_size
        parts = build_engine_parts(config, model, tokenizer, model_id, draft_model)
        self.eos_token_ids = parts.eos_token_ids
        self.runner = parts.runner
        self.step_timer = parts.step_timer
        self.weight_bytes = parts.weight_bytes
        self.max_model_len = parts.max_model_len
        self.kv = parts.kv
        self.host_kv_caches = parts.host_kv_caches
        self.scheduler = parts.scheduler
        self.sampler = parts.sampler
        self.sampling_batches = parts.sampling_batches
        self.speculator = parts.speculator
        self.inputs = parts.inputs
        self.requests: dict[str, RequestState] = {}
        self.beam_groups: dict[str, BeamGroup] = {}
        self._pending: list[StepOutput] = []
        self.num_steps = 0

    # ------------------------------------------------------------------ requests

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None,
                    prior_outputs: Seq[Seq[int]] | None = None,
                    prior_texts: Seq[str] | None = None,
                    prior_finish_reasons: Seq[str | None] | None = None) -> list[int]:
        """Validate a request and queue it; return its prompt token ids.

        ``prior_*`` resume a request an earlier attempt started (failover): per choice,
        the tokens and text it already reported, and a finish reason for choices that had
        already ended. Generation continues after them; they are never reported again.
        Bad input raises before anything is queued, so the engine is left as it was.
        """
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        state = self.inputs.process(request_id, prompt, params, priority=priority,
                                    cache_salt=cache_salt, prior_outputs=prior_outputs,
                                    prior_texts=prior_texts,
                                    prior_finish_reasons=prior_finish_reasons)
        self._queue(state)
        return state.prompt_token_ids

    def _queue(self, state: RequestState) -> None:
        """Hand the unfinished choices to the scheduler (or report a request already done).

        Choices 2..n wait for the first one's prompt, so they find its blocks cached.
        """
        first: Sequence | None = None
        for choice in state.choices:
            if choice.finish_reason is not None:
                continue
            seq = choice.seq
            if first is None:
                first = seq
            elif self.config.enable_prefix_caching:
                seq.waits_for = first
            self.scheduler.add(seq)
        if state.finished:
            self._pending.append(state.step_output())
        else:
            self.requests[state.request_id] = state
            first = state.choices[0].seq
            if first.params.is_beam_search:
                config = beam_config_of(first, self.eos_token_ids, self.max_model_len)
                self.beam_groups[state.request_id] = BeamGroup(state, config)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; reported as ``abort`` by the next step."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return False
        self.beam_groups.pop(request_id, None)
        for choice in state.choices:
            if choice.finish_reason is None:
                self.scheduler.finish(choice.seq, SequenceStatus.FINISHED_ABORTED)
                choice.finish_reason = "abort"
        self._pending.append(state.step_output())
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._pending)

    # ---------------------------------------------------------------------- step

    def step(self) -> list[StepOutput]:
        """Schedule, execute, sample, update; report every request the step touched.

        When the step raises, it is retried on halves of the batch until the requests
        that make it fail are alone; those fail (``StepOutput.error``), the rest go on.
        A sticky device error (``device_errors.py``) is raised instead: it is no
        request's fault, and every later call on the device would fail the same way.
        """
        outputs, self._pending = self._pending, []
        self.step_timer.start()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running, self._prefill_estimate())
        sched = self.scheduler.schedule()
        # Before the forward pass, which may write the blocks a swap-out just freed.
        copy_to_host(self.runner.kv_caches, self.host_kv_caches, sched.swap_out)
        copy_to_device(self.host_kv_caches, self.runner.kv_caches, sched.swap_in)
        copy_blocks(self.runner.kv_caches, sched.copies)  # copy-on-write of forked beams
        if sched.is_empty:
            return outputs
        self.num_steps += 1
        touched: dict[str, RequestState] = {}
        try:
            sampled = self._execute_and_sample(sched.scheduled)
        except Exception as exc:
            if is_sticky_device_error(exc):
                raise  # the device is lost for every request: no part of the batch can run
            log.warning("engine step failed (%r); retrying its batch in parts to find "
                        "the request that makes it fail", exc)
            self._isolate_failure(sched.scheduled, touched)
        else:
            self._update(sched.scheduled, sampled, touched)
            # The whole step, as a decoding stream waits for it: its device work done too
            # (a step where no row samples read nothing back).
            ms = self.step_timer.elapsed_ms()
            self.scheduler.observe_step(sched, ms)
            if self.speculator is not None:
                self.speculator.observe_step(sched.num_batched_tokens, ms)
        for request_id, state in touched.items():
            outputs.append(state.step_output())
            if state.finished:
                del self.requests[request_id]
                self.beam_groups.pop(request_id, None)
        return outputs

    def _prefill_estimate(self) -> int:
        """Prompt tokens the next step will likely compute (for the speculation policy)."""
        pending = sum(s.num_tokens - s.num_computed_tokens for s in self.scheduler.running
                      if s.num_tokens - s.num_computed_tokens > 1)
        if self.scheduler.num_waiting:
            pending += self.config.max_num_batched_tokens
        return min(pending, self.config.max_num_batched_tokens)

    def _execute_and_sample(self, scheduled: Seq[ScheduledSequence]) -> SamplerOutput | None:
        """Run the model on ``scheduled`` and sample its sampling rows; changes no sequence.

        A sequence verifying drafts has one row per draft plus one, each sampled as its
        output position would be without speculation (``speculative/verification.py``).
        """
        logits = self.runner.execute(scheduled)
        sampling: list[Sequence] = []
        offsets: list[int] = []
        for item in scheduled:
            for j in range(item.num_sampling_rows):
                sampling.append(item.seq)
                offsets.append(j)
        if not sampling:
            return None
        result = self.sampler(logits, self.sampling_batches.build(sampling, offsets))
        beams = [row for row, seq in enumerate(sampling) if seq.params.is_beam_search]
        if beams:  # what beam search ranks: log_softmax of the raw logits, as transformers
            per_beam = max(self.beam_groups[sampling[row].request_id].candidates_per_beam
                           for row in beams)
            result.beam_log_probs, result.beam_token_ids = beam_candidates(logits[beams],
                                                                           per_beam)
            result.beam_rows = beams
        return result

    def _update(self, scheduled: Seq[ScheduledSequence], result: SamplerOutput | None,
                touched: dict[str, RequestState]) -> None:
        """Let the scheduler apply the step, then record each new token for its request."""
        rows = result.token_ids if result is not None else []
        sampling = [item for item in scheduled if item.samples]
        tokens: list[int] = []
        accepted: list[int] = []
        first_rows: list[int] = []
        row = 0
        for item in sampling:  # each item's target token follows its accepted drafts
            n = accepted_length(rows[row : row + len(item.drafts) + 1], item.drafts)
            first_rows.append(row)
            accepted.append(n)
            tokens.append(rows[row + n])
            row += len(item.drafts) + 1
        before = [item.seq.num_tokens for item in sampling]
        detok_failures: dict[str, Exception] = {}

        def stop_string(seq: Sequence, token: int) -> bool:
            choice = self.requests[seq.request_id].choices[seq.choice_index]
            try:
                return choice.detok.add_token(token)
            except Exception as exc:  # fails this request alone, below
                detok_failures.setdefault(seq.request_id, exc)
                return False

        grown = self.scheduler.update_from_output(scheduled, tokens, stop_string, accepted)
        if result is not None and result.beam_log_probs is not None:
            self._advance_beams(grown, first_rows, result, touched)
        for i, seq in enumerate(grown):
            if sampling[i].drafts and self.speculator is not None:
                self.speculator.verified(seq, len(sampling[i].drafts), accepted[i])
            if seq.params.is_beam_search:
                continue
            # A scheduled sequence's request is always here: requests leave only once
            # every choice is finished, and a finished sequence is never scheduled.
            state = self.requests[seq.request_id]
            assert result is not None
            for j in range(seq.num_tokens - before[i]):  # accepted drafts, then its own
                self._record_token(state.choices[seq.choice_index], result,
                                   first_rows[i] + j)
            touched[seq.request_id] = state
        for request_id, exc in detok_failures.items():
            self._fail_request(request_id, exc, touched)

    def _advance_beams(self, grown: list[Sequence], first_rows: list[int],
                       result: SamplerOutput, touched: dict[str, RequestState]) -> None:
        """Hand each beam its row; step every beam search whose beams all have one."""
        assert result.beam_log_probs is not None
        assert result.beam_token_ids is not None
        seq_of_row = {row: seq for row, seq in zip(first_rows, grown, strict=True)}
        ready: list[BeamGroup] = []
        for i, row in enumerate(result.beam_rows):
            beam = seq_of_row[row]  # a beam never verifies drafts: its one row
            group = self.beam_groups[beam.request_id]
            group.add_row(beam, result.beam_log_probs[i], result.beam_token_ids[i])
            if group.ready and group not in ready:
                ready.append(group)
        for group in ready:
            group.advance(self.scheduler, self.tokenizer)
            touched[group.state.request_id] = group.state

    def _isolate_failure(self, scheduled: Seq[ScheduledSequence],
                         touched: dict[str, RequestState]) -> None:
        """Run ``scheduled`` in halves until each failure is down to one sequence.

        Nothing of a failed attempt is kept (``update`` never ran), so a part that
        succeeds is applied like a normal step and a lone sequence that fails ends its
        request alone.
        """
        parts = [list(scheduled)]
        while parts:
            part = [item for item in parts.pop() if not item.seq.is_finished]
            if not part:
                continue
            try:
                sampled = self._execute_and_sample(part)
            except Exception as exc:
                if is_sticky_device_error(exc):
                    raise
                if len(part) == 1:
                    self._fail_request(part[0].seq.request_id, exc, touched)
                else:
                    middle = len(part) // 2
                    parts += [part[middle:], part[:middle]]
                continue
            self._update(part, sampled, touched)

    def _fail_request(self, request_id: str, exc: Exception,
                      touched: dict[str, RequestState]) -> None:
        log.error("request %s makes the engine step fail; failing it alone",
                  request_id, exc_info=exc)
        state = self.requests[request_id]
        self.beam_groups.pop(request_id, None)
        for choice in state.choices:
            if choice.finish_reason is None:
                self.scheduler.finish(choice.seq, SequenceStatus.FINISHED_ABORTED)
                choice.finish_reason = SequenceStatus.FINISHED_ABORTED.value
        error = RequestFailedError(f"the engine step failed on this request: {exc!r}")
        error.__cause__ = exc
        state.error = error
        touched[request_id] = state

    def _record_token(self, choice: ChoiceState, result: SamplerOutput, row: int) -> None:
        """Note a token the scheduler appended: news to report, logprobs, the finish."""
        seq = choice.seq
        token = result.token_ids[row]
        choice.new_ids.append(token)
        if choice.cumulative_logprob is not None and result.token_logprobs is not None:
            choice.cumulative_logprob += result.token_logprobs[row]
        if choice.logprobs is not None and result.token_logprobs is not None:
            k = seq.params.logprobs or 0
            assert result.top_ids is not None
            assert result.top_logprobs is not None
            entry = SampledLogprob(
                token_id=token,
                logprob=result.token_logprobs[row],
                top=list(zip(result.top_ids[row][:k], result.top_logprobs[row][:k])),
            )
            choice.logprobs.append(entry)
            choice.new_logprobs.append(entry)
        if seq.is_finished:
            choice.finish_reason = seq.status.value

    # --------------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        return engine_stats(self.scheduler, self.kv, self.speculator,
                            requests=len(self.requests), steps=self.num_steps,
                            weight_bytes=self.weight_bytes, max_model_len=self.max_model_len,
                            block_size=self.config.block_size)
