"""A request's state inside the engine: one ``Sequence`` per sampled choice."""

from __future__ import annotations

import enum
import itertools
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvrelay_worker.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kvrelay_worker.engine.lora.adapter import LoraAdapter
    from kvrelay_worker.engine.sample.detokenizer import IncrementalDetokenizer
    from kvrelay_worker.engine.sample.grammar import SequenceGrammar

_seq_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    # Preempted by swap: waiting to resume, its computed tokens' KV in the host pool.
    SWAPPED = "swapped"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {
    SequenceStatus.FINISHED_STOPPED,
    SequenceStatus.FINISHED_LENGTH,
    SequenceStatus.FINISHED_ABORTED,
}


@dataclass(eq=False)
class Sequence:
    """Tokens (prompt then output), how many have KV in the cache, and where that KV lives.

    ``num_computed_tokens`` counts tokens whose K/V are in the cache (computed or served
    from the prefix cache); the next step computes ``token_ids[num_computed_tokens:]`` (or
    a chunk of it). ``block_table`` lists the cache blocks holding the sequence's tokens
    in order. Output tokens carried over from an earlier attempt (failover) are in
    ``token_ids`` like any other output: part of the context, already reported, never
    reported again.
    """

    request_id: str
    choice_index: int
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    priority: int = 0
    arrival_order: int = 0
    cache_salt: str | None = None
    # The request's LoRA adapter (None: the base model): its rows run with it, and its
    # blocks are cached under it (``kv_cache.root_hash``).
    lora: LoraAdapter | None = None
    seq_id: int = field(default_factory=lambda: next(_seq_counter))
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    # An int32 array, not a list: the model runner copies it into the step's block-table
    # tensor every step, and numpy reads an array's buffer at once (a list item by item).
    block_table: array[int] = field(default_factory=lambda: array("i"))
    # Hashes of the full blocks of token_ids, in order (chained: each covers its prefix).
    block_hashes: list[bytes] = field(default_factory=list)
    # Prompt tokens served from the prefix cache at first admission.
    num_cached_tokens: int = -1
    num_preemptions: int = 0
    # Set on choices 1..n-1: they wait until the first choice's prompt is in the cache.
    waits_for: Sequence | None = None
    # The response_format matcher of a constrained sequence (one per choice).
    grammar: SequenceGrammar | None = None
    # Speculative decoding: tokens a proposer guessed to follow ``token_ids``, set before a
    # step schedules; never part of ``token_ids`` until the target model verified them.
    draft_token_ids: list[int] = field(default_factory=list)
    # The choice's text: told each token as it is appended, it says when a stop string
    # completes (``ChoiceState`` sets it). What it raises is kept in ``detok_error``: the
    # engine fails this request alone once the step's update is done.
    detok: IncrementalDetokenizer | None = None
    detok_error: Exception | None = None
    # True while the prompt's log-probabilities are still to compute (``prompt_logprobs``,
    # choice 0): the prompt then runs whole, with no prefix-cache hit, and each chunk's
    # positions are scored. The scheduler clears it once the prompt is computed.
    scores_prompt: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def prompt_computed(self) -> bool:
        """True once every prompt token's K/V is in the cache."""
        return self.num_computed_tokens >= self.num_prompt_tokens

    def append_token(self, token_id: int) -> bool:
        """Append ``token_id``; True when it completed one of the request's stop strings."""
        self.token_ids.append(token_id)
        if self.grammar is not None:  # its next mask must follow the new token
            self.grammar.accept(token_id)
        if self.detok is None:
            return False
        try:
            return self.detok.add_token(token_id)
        except Exception as exc:  # fails this request alone (the engine reads it)
            if self.detok_error is None:
                self.detok_error = exc
            return False
