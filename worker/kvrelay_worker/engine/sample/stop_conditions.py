"""When a sequence is done: the token-level stop rules the scheduler applies after a step.

Stop strings are text, so the detokenizer finds them as each token is appended
(``Sequence.append_token`` says whether one matched); the scheduler decides the finish
with the other rules, in one order: a stop (end of sequence, a stop token, a stop string)
once ``min_tokens`` are out, else a length limit.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from kvrelay_worker.engine.sched.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class StopConditions:
    """The engine-wide part of the rules: end-of-sequence ids and the length limit."""

    eos_token_ids: Collection[int] = ()
    max_model_len: int | None = None

    def finish_status(self, seq: Sequence, token: int,
                      stopped_by_string: bool) -> SequenceStatus | None:
        """How ``seq`` ends now that ``token`` was appended, or None if it goes on."""
        params = seq.params
        grammar = seq.grammar
        if grammar is not None and (grammar.is_terminated or grammar.rejected):
            # The grammar decides where a constrained output ends (min_tokens aside).
            return (SequenceStatus.FINISHED_ABORTED if grammar.rejected
                    else SequenceStatus.FINISHED_STOPPED)
        if seq.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token in self.eos_token_ids:
                return SequenceStatus.FINISHED_STOPPED
            if params.stop_token_ids and token in params.stop_token_ids:
                return SequenceStatus.FINISHED_STOPPED
            if stopped_by_string:
                return SequenceStatus.FINISHED_STOPPED
        return self.length_status(seq)

    def length_status(self, seq: Sequence) -> SequenceStatus | None:
        """``FINISHED_LENGTH`` once ``max_tokens`` are out or the context is full."""
        max_tokens = seq.params.max_tokens
        if max_tokens is not None and seq.num_output_tokens >= max_tokens:
            return SequenceStatus.FINISHED_LENGTH
        if self.max_model_len is not None and seq.num_tokens >= self.max_model_len:
            return SequenceStatus.FINISHED_LENGTH
        return None
