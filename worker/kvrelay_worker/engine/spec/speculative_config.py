"""The speculative-decoding setting's forms and limits, written once.

``EngineConfig`` (``LLM(..., speculative=...)``) and the worker's ``KVRELAY_SPECULATIVE*``
variables both check through here, so a value one accepts the other accepts too. No torch:
the worker validates its settings before it loads any engine code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

SpeculativeMethod = Literal["off", "ngram", "draft"]

# "draft:<model name or path>": the prefix before the draft model.
DRAFT_PREFIX: Final = "draft:"
DEFAULT_SPECULATIVE: Final = "off"
# k: the most draft tokens proposed per sequence per step.
DEFAULT_NUM_SPECULATIVE_TOKENS: Final = 4
MAX_NUM_SPECULATIVE_TOKENS: Final = 16
# The n-gram lengths prompt lookup matches: 1 <= min <= max <= MAX_NGRAM.
DEFAULT_NGRAM_MIN: Final = 2
DEFAULT_NGRAM_MAX: Final = 4
MAX_NGRAM: Final = 8

FORMS: Final = f"off, ngram or {DRAFT_PREFIX}<model name or path>"


class SpeculativeSettingError(ValueError):
    """A speculative-decoding value outside its forms or limits; the message says which."""


@dataclass(frozen=True)
class SpeculativeChoice:
    """A parsed ``speculative`` value: the method, and the draft model for ``draft``."""

    method: SpeculativeMethod
    draft_model: str | None = None


def parse_speculative(value: object, name: str = "speculative") -> SpeculativeChoice:
    """``"off"``, ``"ngram"`` or ``"draft:<model>"`` (method in any case, spaces around
    ignored) -> its parts; anything else raises ``SpeculativeSettingError`` naming ``name``."""
    if not isinstance(value, str):
        raise SpeculativeSettingError(
            f"{name} must be a string ({FORMS}), got {type(value).__name__} {value!r}")
    method, colon, model = value.strip().partition(":")
    method = method.strip().lower()
    if method == "off" and not colon:
        return SpeculativeChoice("off")
    if method == "ngram" and not colon:
        return SpeculativeChoice("ngram")
    if method == "draft" and colon:
        if not model.strip():
            raise SpeculativeSettingError(
                f"{name} {value!r} names no draft model: use {DRAFT_PREFIX}<model name or path>")
        return SpeculativeChoice("draft", model.strip())
    raise SpeculativeSettingError(f"{name} must be {FORMS}, got {value!r}")


def check_num_speculative_tokens(value: object, name: str = "num_speculative_tokens") -> int:
    """k as an int in 1..MAX_NUM_SPECULATIVE_TOKENS, else ``SpeculativeSettingError``."""
    if isinstance(value, int) and not isinstance(value, bool) and (
            1 <= value <= MAX_NUM_SPECULATIVE_TOKENS):
        return value
    raise SpeculativeSettingError(
        f"{name} must be an integer from 1 to {MAX_NUM_SPECULATIVE_TOKENS}, got {value!r}")


def check_ngram_range(low: object, high: object,
                      name: str = "speculative_ngram_min and speculative_ngram_max"
                      ) -> tuple[int, int]:
    """The n-gram lengths as ints with 1 <= low <= high <= MAX_NGRAM."""
    whole = [isinstance(n, int) and not isinstance(n, bool) for n in (low, high)]
    if not all(whole) or not isinstance(low, int) or not isinstance(high, int) or not (
            1 <= low <= high <= MAX_NGRAM):
        raise SpeculativeSettingError(
            f"{name} must be integers with 1 <= min <= max <= {MAX_NGRAM}, "
            f"got {low!r} and {high!r}")
    return low, high


def parse_ngram_range(text: str, name: str = "the n-gram range") -> tuple[int, int]:
    """``"2-4"`` (min-max) or ``"3"`` (both) -> the checked (min, max)."""
    parts = [part.strip() for part in text.strip().split("-")]
    numbers = [int(p) for p in parts if p.isascii() and p.isdigit()]
    if len(parts) not in (1, 2) or len(numbers) != len(parts) or not (
            1 <= numbers[0] <= numbers[-1] <= MAX_NGRAM):
        raise SpeculativeSettingError(
            f"{name} must be MIN-MAX (e.g. 2-4) or one number, with 1 <= MIN <= MAX <= "
            f"{MAX_NGRAM}, got {text!r}")
    return numbers[0], numbers[-1]


def describe_speculative(speculative: str, num_tokens: int, ngram_min: int,
                         ngram_max: int) -> str:
    """One phrase for logs: "off", "ngram (k=4, n=2-4)", "draft:<model> (k=4)"."""
    choice = parse_speculative(speculative)
    if choice.method == "off":
        return "off"
    if choice.method == "ngram":
        return f"ngram (k={num_tokens}, n={ngram_min}-{ngram_max})"
    return f"{DRAFT_PREFIX}{choice.draft_model} (k={num_tokens})"
