"""Per-request sampling options, validated on construction by the wire contract's rules.

The types, bounds and defaults live in ``kvrelay.protocol.SamplingOptions``; this class
is its keyword form for the engine and the offline ``LLM`` API, so the engine accepts
exactly what a client may send and a worker may decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import msgspec

from kvrelay.protocol import (
    InvalidSamplingOptions,
    ResponseFormat,
    SamplingOptions,
    sampling_options_from,
)
from kvrelay_worker.engine.errors import SamplingParamsError
from kvrelay_worker.engine.tools.plan import ToolPlan

# Defaults come from the wire struct, never written here.
_WIRE = SamplingOptions()


@dataclass
class SamplingParams:
    """How to pick each next token, and when to stop.

    ``temperature == 0`` is greedy. ``top_k`` of 0 or -1 disables top-k. Penalties follow
    their usual meanings: ``repetition_penalty`` divides positive logits (multiplies
    negative ones) of every token seen in prompt or output, as Hugging Face does;
    ``presence_penalty``/``frequency_penalty`` subtract per output occurrence, as OpenAI
    does. ``seed`` makes a request's tokens depend only on the seed, the position and the
    logits. ``n`` samples several completions of one prompt (they share its cached
    blocks). ``best_of`` > ``n`` samples that many candidates (sharing the prompt's
    blocks the same way) and returns the ``n`` with the highest cumulative log-probability,
    the sum of the sampled tokens' logprobs as ``logprobs`` reports them (the distribution
    after penalties and temperature, before top-k/top-p/min-p); greedy requests ignore it
    (their candidates would all be the same). ``max_tokens=None``
    generates until a stop condition or ``max_model_len``.
    Bounds: see ``kvrelay.protocol`` (README, "SDK options").
    """

    n: int = _WIRE.n
    max_tokens: int | None = _WIRE.max_tokens
    temperature: float = _WIRE.temperature
    top_p: float = _WIRE.top_p
    top_k: int = _WIRE.top_k
    min_p: float = _WIRE.min_p
    repetition_penalty: float = _WIRE.repetition_penalty
    presence_penalty: float = _WIRE.presence_penalty
    frequency_penalty: float = _WIRE.frequency_penalty
    logit_bias: dict[int, float] | None = None
    seed: int | None = _WIRE.seed
    logprobs: int | None = _WIRE.logprobs
    min_tokens: int = _WIRE.min_tokens
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = _WIRE.ignore_eos
    skip_special_tokens: bool = True
    best_of: int | None = _WIRE.best_of
    # A JSON schema, JSON object, regex or choice the output must match (engine/sample/grammar.py).
    response_format: ResponseFormat | None = _WIRE.response_format
    # Beam search (engine/beam/beam_search.py); 1 is off.
    beam_width: int = _WIRE.beam_width
    length_penalty: float = _WIRE.length_penalty
    early_stopping: bool | str = _WIRE.early_stopping
    # False: this request decodes without speculation.
    speculative: bool = _WIRE.speculative
    # Log-probabilities of the prompt's tokens (reported once, with the first tokens).
    prompt_logprobs: int | None = _WIRE.prompt_logprobs
    # Not sampling options of the wire (set by the worker's intake from the request):
    # how tool calls are constrained and parsed, and which reasoning parser splits the
    # model's thinking from its answer (``engine/tools``).
    tool_plan: ToolPlan | None = None
    reasoning_parser: str | None = None
    stop_strings: tuple[str, ...] = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        given = {f.name: getattr(self, f.name) for f in fields(self) if f.name in _WIRE_FIELDS}
        try:
            checked = sampling_options_from(given)
        except InvalidSamplingOptions as exc:
            raise SamplingParamsError(str(exc)) from None
        # Normalised values (floats as float, digit-string bias keys as ints, ...).
        for name in _WIRE_FIELDS - {"stop", "logit_bias"}:
            setattr(self, name, getattr(checked, name))
        self.stop_strings = tuple(checked.stop)
        self.logit_bias = checked.logit_bias or None

    @classmethod
    def from_options(cls, options: SamplingOptions) -> SamplingParams:
        """The engine's form of a decoded request's options."""
        return cls(**msgspec.structs.asdict(options))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def effective_top_k(self) -> int:
        """0 when top-k is off; ``top_k`` otherwise."""
        return 0 if self.top_k in (0, -1) else self.top_k

    @property
    def is_beam_search(self) -> bool:
        return self.beam_width > 1

    @property
    def reports_at_end(self) -> bool:
        """Whether choices are only known once the request is done (best_of, beams):
        nothing streams before, and a resumed job restarts from its prompt."""
        return self.selects_best or self.is_beam_search

    @property
    def selects_best(self) -> bool:
        """Whether more candidates run than are returned (``best_of`` > ``n``, sampled)."""
        return self.best_of is not None and self.best_of > self.n and not self.greedy

    @property
    def num_candidates(self) -> int:
        """Sequences the engine starts for the request: ``best_of`` when it selects, one
        with beam search (the other beams fork from it after the prompt), else ``n``."""
        if self.is_beam_search:
            return 1
        return self.best_of if self.best_of is not None and self.selects_best else self.n

    @property
    def needs_token_logprobs(self) -> bool:
        """Whether the sampler must give each sampled token's log-probability: asked for,
        or needed to rank ``best_of`` candidates."""
        return self.logprobs is not None or self.selects_best

    @property
    def needs_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


_WIRE_FIELDS = frozenset(SamplingOptions.__struct_fields__)
