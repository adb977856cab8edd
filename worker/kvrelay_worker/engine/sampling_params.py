"""Per-request sampling options, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvrelay_worker.engine.errors import SamplingParamsError

MAX_LOGPROBS = 20
MAX_N = 128
_SEED_LIMIT = 1 << 63


def _fail(message: str) -> None:
    raise SamplingParamsError(message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """How to pick each next token, and when to stop.

    ``temperature == 0`` is greedy. ``top_k`` of 0 or -1 disables top-k. Penalties follow
    their usual meanings: ``repetition_penalty`` divides positive logits (multiplies
    negative ones) of every token seen in prompt or output, as Hugging Face does;
    ``presence_penalty``/``frequency_penalty`` subtract per output occurrence, as OpenAI
    does. ``seed`` makes a request's tokens depend only on the seed, the position and the
    logits. ``n`` samples several completions of one prompt (they share its cached
    blocks). ``max_tokens=None`` generates until a stop condition or ``max_model_len``.
    """

    n: int = 1
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    logprobs: int | None = None
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop_strings: tuple[str, ...] = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        self._validate_numbers()
        self._validate_stops()
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                _fail("logit_bias must be a mapping of token id to bias")
            for token, bias in self.logit_bias.items():
                if not _is_int(token) or token < 0:
                    _fail(f"logit_bias keys must be non-negative token ids, got {token!r}")
                if not _is_number(bias) or not math.isfinite(bias):
                    _fail(f"logit_bias values must be finite numbers, got {bias!r}")
            self.logit_bias = {int(t): max(-100.0, min(100.0, float(b)))
                               for t, b in self.logit_bias.items()}

    def _validate_numbers(self) -> None:
        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            _fail(f"n must be an integer in [1, {MAX_N}], got {self.n!r}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            _fail(f"max_tokens must be a positive integer or None, got {self.max_tokens!r}")
        floats = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
        }
        for name, value in floats.items():
            if not _is_number(value) or not math.isfinite(value):
                _fail(f"{name} must be a finite number, got {value!r}")
        if self.temperature < 0:
            _fail(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            _fail(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            _fail(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            _fail(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= floats[name] <= 2:
                _fail(f"{name} must be in [-2, 2], got {floats[name]}")
        if not _is_int(self.top_k) or self.top_k < -1:
            _fail(f"top_k must be an integer >= -1 (0 or -1 disable it), got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not -_SEED_LIMIT <= self.seed < _SEED_LIMIT):
            _fail(f"seed must be a 64-bit integer, got {self.seed!r}")
        if self.logprobs is not None and (
            not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            _fail(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            _fail(f"min_tokens must be a non-negative integer, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            _fail(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        self.temperature = float(self.temperature)
        self.top_p = float(self.top_p)
        self.min_p = float(self.min_p)

    def _validate_stops(self) -> None:
        # Only lists and tuples: iterating anything else would accept a dict's keys or a
        # bytes object's ints, or fail with a TypeError instead of a clear message.
        if self.stop is not None and not isinstance(self.stop, (str, list, tuple)):
            _fail(f"stop must be a string or a list of strings, got {self.stop!r}")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        for s in stop:
            if not isinstance(s, str) or not s:
                _fail(f"stop strings must be non-empty strings, got {s!r}")
        self.stop_strings = tuple(stop)
        if self.stop_token_ids is not None and not isinstance(self.stop_token_ids, (list, tuple)):
            _fail(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}")
        ids = list(self.stop_token_ids or [])
        for t in ids:
            if not _is_int(t) or t < 0:
                _fail(f"stop_token_ids must be non-negative integers, got {t!r}")
        self.stop_token_ids = ids

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def effective_top_k(self) -> int:
        """0 when top-k is off; ``top_k`` otherwise."""
        return 0 if self.top_k in (0, -1) else self.top_k

    @property
    def needs_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )
