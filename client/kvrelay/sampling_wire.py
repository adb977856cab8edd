"""The wire types of sampling: how a job picks each next token, when it stops, the shape
its output must take (``response_format``), and the bounds of a request's ``priority``.

The one place where a sampling option's type, bounds and default are written. The
SDK's keywords, the worker's payload decoder and the engine's ``SamplingParams`` all
validate through ``SamplingOptions`` (``sampling_options_from`` for Python values,
``kvrelay.protocol.decode_request_json`` for the wire), so each accepts exactly what the
others do. Kept apart from ``kvrelay.protocol`` (which re-exports every name here) so the
contract of one feature reads in one place; the same rules hold: fields are only
appended, with defaults.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from kvrelay.tool_wire import MAX_SCHEMA_BYTES

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_BEAM_WIDTH",
    "MAX_CHOICES",
    "MAX_CHOICE_CHARS",
    "MAX_FORMAT_NAME_CHARS",
    "MAX_LENGTH_PENALTY",
    "MAX_LOGIT_BIAS",
    "MAX_LOGIT_BIAS_ENTRIES",
    "MAX_LOGPROBS",
    "MAX_N",
    "MAX_OCCURRENCE_PENALTY",
    "MAX_PATTERN_CHARS",
    "MAX_PRIORITY",
    "MAX_REPETITION_PENALTY",
    "MAX_SEED",
    "MAX_STOP_STRINGS",
    "MAX_STOP_STRING_CHARS",
    "MAX_STOP_TOKEN_IDS",
    "MAX_TEMPERATURE",
    "MAX_TOKENS_LIMIT",
    "MAX_TOKEN_ID",
    "MAX_TOP_K",
    "MIN_PRIORITY",
    "MIN_SEED",
    "SAMPLING_FIELDS",
    "ChoiceFormat",
    "InvalidSamplingOptions",
    "JsonObjectFormat",
    "JsonSchemaFormat",
    "JsonSchemaSpec",
    "LogitBias",
    "OccurrencePenalty",
    "Priority",
    "Probability",
    "RegexFormat",
    "ResponseFormat",
    "SamplingOptions",
    "StopString",
    "TextFormat",
    "TokenCount",
    "TokenId",
    "priority_from",
    "sampling_options_from",
]

# Generated tokens when the caller does not say (SDK, wire, engine and CLI alike).
DEFAULT_MAX_TOKENS: Final = 256
# Largest max_tokens / min_tokens: no context is longer, and it fits an int32 tensor.
MAX_TOKENS_LIMIT: Final = 1 << 24
# Largest token id anywhere in the options (int32); the engine also checks its vocabulary.
MAX_TOKEN_ID: Final = (1 << 31) - 1
MAX_N: Final = 128
MAX_LOGPROBS: Final = 20
# top_k above the vocabulary means "all of it": the engine clamps to its vocabulary.
MAX_TOP_K: Final = 1 << 20
# The seed range the engine's generators take (a signed 64-bit integer).
MIN_SEED: Final = -(1 << 63)
MAX_SEED: Final = (1 << 63) - 1
MAX_TEMPERATURE: Final = 100.0
MAX_REPETITION_PENALTY: Final = 100.0
# presence_penalty and frequency_penalty lie in [-MAX_OCCURRENCE_PENALTY, +...] (OpenAI's).
MAX_OCCURRENCE_PENALTY: Final = 2.0
MAX_STOP_STRINGS: Final = 16
MAX_BEAM_WIDTH: Final = 16
# length_penalty lies in [-MAX_LENGTH_PENALTY, MAX_LENGTH_PENALTY] (finite).
MAX_LENGTH_PENALTY: Final = 10.0
MAX_STOP_STRING_CHARS: Final = 256
MAX_STOP_TOKEN_IDS: Final = 256
MAX_LOGIT_BIAS_ENTRIES: Final = 300
# A logit bias lies in [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS] (OpenAI's range).
MAX_LOGIT_BIAS: Final = 100.0
# ``priority`` (a request field, not a sampling option) fits an int32.
MIN_PRIORITY: Final = -(1 << 31)
MAX_PRIORITY: Final = (1 << 31) - 1

TokenId = Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]
TokenCount = Annotated[int, Meta(ge=0, le=MAX_TOKENS_LIMIT)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
OccurrencePenalty = Annotated[float, Meta(ge=-MAX_OCCURRENCE_PENALTY, le=MAX_OCCURRENCE_PENALTY)]
StopString = Annotated[str, Meta(min_length=1, max_length=MAX_STOP_STRING_CHARS)]
LogitBias = Annotated[float, Meta(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]
Priority = Annotated[int, Meta(ge=MIN_PRIORITY, le=MAX_PRIORITY)]


# Structured output (``response_format``): the sizes a worker compiles into a grammar.
MAX_PATTERN_CHARS: Final = 2048
MAX_CHOICES: Final = 256
MAX_CHOICE_CHARS: Final = 512
MAX_FORMAT_NAME_CHARS: Final = 64


class JsonSchemaSpec(msgspec.Struct, kw_only=True, omit_defaults=True):
    """OpenAI's ``json_schema`` member: a name and the JSON Schema the output must match."""

    name: Annotated[str, Meta(min_length=1, max_length=MAX_FORMAT_NAME_CHARS)] = "schema"
    schema: dict[str, Any] = msgspec.field(default_factory=dict)
    description: str | None = None
    strict: bool | None = None

    def __post_init__(self) -> None:
        size = len(msgspec.json.encode(self.schema))
        if size > MAX_SCHEMA_BYTES:
            raise ValueError(f"the JSON schema is {size} bytes, "
                             f"over the {MAX_SCHEMA_BYTES} allowed")


class TextFormat(msgspec.Struct, tag="text", tag_field="type", kw_only=True):
    """Free text (OpenAI's default): no constraint."""


class JsonObjectFormat(msgspec.Struct, tag="json_object", tag_field="type", kw_only=True):
    """Any JSON object (OpenAI's JSON mode)."""


class JsonSchemaFormat(msgspec.Struct, tag="json_schema", tag_field="type", kw_only=True):
    """JSON that validates against ``json_schema.schema`` (OpenAI's structured outputs)."""

    json_schema: JsonSchemaSpec


class RegexFormat(msgspec.Struct, tag="regex", tag_field="type", kw_only=True):
    """Text matching a regular expression, whole (vLLM's ``guided_regex``)."""

    pattern: Annotated[str, Meta(min_length=1, max_length=MAX_PATTERN_CHARS)]


class ChoiceFormat(msgspec.Struct, tag="choice", tag_field="type", kw_only=True):
    """Exactly one of ``choices`` (vLLM's ``guided_choice``)."""

    choices: Annotated[
        list[Annotated[str, Meta(min_length=1, max_length=MAX_CHOICE_CHARS)]],
        Meta(min_length=1, max_length=MAX_CHOICES),
    ]


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat | RegexFormat | ChoiceFormat


class InvalidSamplingOptions(ValueError):
    """A sampling option (or ``priority``) outside its bounds; the message names it."""


class SamplingOptions(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How to pick each next token, and when to stop: the bounds every side enforces.

    ``temperature`` 0 is greedy; ``top_k`` 0 or -1 disables top-k; ``max_tokens=None``
    runs to a stop condition or the model's context limit. Every float is finite.
    ``best_of`` > ``n`` samples ``best_of`` candidates and returns the ``n`` most likely
    (their text arrives all at once, when every candidate is done: the winners are not
    known before). With ``temperature`` 0 it is accepted, as OpenAI does, and means ``n``:
    greedy candidates are all the same.
    """

    n: Annotated[int, Meta(ge=1, le=MAX_N)] = 1
    # 0 only with ``prompt_logprobs``: score the prompt, generate nothing (``echo``).
    max_tokens: Annotated[int, Meta(ge=0, le=MAX_TOKENS_LIMIT)] | None = DEFAULT_MAX_TOKENS
    temperature: Annotated[float, Meta(ge=0.0, le=MAX_TEMPERATURE)] = 1.0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Meta(ge=-1, le=MAX_TOP_K)] = 0
    min_p: Probability = 0.0
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=MAX_REPETITION_PENALTY)] = 1.0
    presence_penalty: OccurrencePenalty = 0.0
    frequency_penalty: OccurrencePenalty = 0.0
    seed: Annotated[int, Meta(ge=MIN_SEED, le=MAX_SEED)] | None = None
    stop: Annotated[list[StopString], Meta(max_length=MAX_STOP_STRINGS)] = msgspec.field(
        default_factory=list
    )
    stop_token_ids: Annotated[list[TokenId], Meta(max_length=MAX_STOP_TOKEN_IDS)] = (
        msgspec.field(default_factory=list)
    )
    logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    ignore_eos: bool = False
    min_tokens: TokenCount = 0
    logit_bias: Annotated[dict[TokenId, LogitBias], Meta(max_length=MAX_LOGIT_BIAS_ENTRIES)] = (
        msgspec.field(default_factory=dict)
    )
    # Candidates sampled (sharing the prompt's blocks) of which the ``n`` with the highest
    # cumulative log-probability are returned; None means ``n``. Same cap as ``n``.
    best_of: Annotated[int, Meta(ge=1, le=MAX_N)] | None = None
    # Constrains the output to a JSON schema, any JSON object, a regex or a choice
    # (a grammar mask on every step; EOS only where the grammar may end). None: free text.
    response_format: ResponseFormat | None = None
    # Beam search (1: off): ``beam_width`` beams advance together and the ``n`` best
    # finished hypotheses return, scored as transformers' ``generate(num_beams=...)``
    # (sum of logprobs / generated length ** ``length_penalty``); ``early_stopping`` is
    # its rule for when to stop (True, False or "never"). Deterministic: temperature,
    # top_p, top_k, min_p and seed are ignored, as transformers does without sampling.
    beam_width: Annotated[int, Meta(ge=1, le=MAX_BEAM_WIDTH)] = 1
    length_penalty: Annotated[float, Meta(ge=-MAX_LENGTH_PENALTY, le=MAX_LENGTH_PENALTY)] = 1.0
    early_stopping: bool | Literal["never"] = False
    # False: this request decodes without speculation, whatever the worker's
    # KVRELAY_SPECULATIVE says (README, "Speculative decoding").
    speculative: bool = True
    # The log-probability of every prompt token after the first (and this many most
    # likely alternatives at each position), reported once on the first ``Tokens`` event
    # of choice 0 (``Tokens.prompt_logprobs``). The prompt is then computed whole: no
    # prefix-cache hit for this request.
    prompt_logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None

    def __post_init__(self) -> None:
        # Runs on decode and convert too: the rules that span two fields.
        if self.max_tokens == 0 and self.prompt_logprobs is None:
            raise ValueError("max_tokens may be 0 only with prompt_logprobs "
                             "(scoring the prompt alone)")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) must be at least n ({self.n})")
        if self.beam_width > 1:
            _check_beam_search(self)


def _check_beam_search(options: SamplingOptions) -> None:
    """Refuse what beam search does not combine with: more choices than beams, and the
    options that change or report per-token sampling (its scores are plain logprobs)."""
    if options.n > options.beam_width:
        raise ValueError(f"n ({options.n}) must not exceed beam_width ({options.beam_width})")
    refused = [name for name, off in (
        ("best_of", options.best_of is None),
        ("repetition_penalty", options.repetition_penalty == 1.0),
        ("presence_penalty", options.presence_penalty == 0.0),
        ("frequency_penalty", options.frequency_penalty == 0.0),
        ("logit_bias", not options.logit_bias),
        ("min_tokens", options.min_tokens == 0),
        ("logprobs", options.logprobs is None),
        ("stop", not options.stop),
        ("response_format", options.response_format is None),
    ) if not off]
    if refused:
        raise ValueError(f"beam_width > 1 does not combine with {', '.join(refused)}")


SAMPLING_FIELDS: Final = frozenset(SamplingOptions.__struct_fields__)
# Keywords where None means "not given" (the wire default applies). ``max_tokens=None``
# is a value: no limit but the context.
_NONE_MEANS_DEFAULT: Final = SAMPLING_FIELDS - {"max_tokens"}


_PATH = re.compile(r"\$\.([\w.\[\]]+)")


def _readable(error: msgspec.ValidationError, values: Mapping[str, Any]) -> str:
    """msgspec's "Expected `int` <= 20 - at `$.logprobs`" -> "logprobs: expected ..., got 21"."""
    text = str(error)
    message, sep, where = text.rpartition(" - at ")
    found = _PATH.search(where)
    if not sep or found is None:
        return text  # a cross-field rule's own message
    path = found.group(1)
    if where.startswith("`key`"):
        path += " key"
    value = values.get(path)
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path}: must be a finite number, got {value!r}"
    got = f", got {value!r}" if path in values and ", got" not in message else ""
    return f"{path}: {message[:1].lower()}{message[1:]}{got}"


def _bias_key(key: object) -> object:
    # JSON carries a logit_bias key as a string of digits: accept the same from Python.
    # (Longer strings stay strings and are refused: int() would choke on thousands of digits.)
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 20:
        return int(key)
    return key


def sampling_options_from(values: Mapping[str, Any]) -> SamplingOptions:
    """Validate sampling keywords into ``SamplingOptions``; raises ``InvalidSamplingOptions``.

    The keyword conveniences (shared by the SDK and ``SamplingParams``): ``stop`` may be a
    single string; ``None`` means "not given" for every option but ``max_tokens``.
    """
    unknown = set(values) - SAMPLING_FIELDS
    if unknown:
        raise InvalidSamplingOptions(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
    given = {k: v for k, v in values.items() if v is not None or k not in _NONE_MEANS_DEFAULT}
    if isinstance(given.get("stop"), str):
        given["stop"] = [given["stop"]]
    bias = given.get("logit_bias")
    if isinstance(bias, Mapping):
        given["logit_bias"] = {_bias_key(k): v for k, v in bias.items()}
    try:
        return msgspec.convert(given, SamplingOptions)
    except msgspec.ValidationError as exc:
        raise InvalidSamplingOptions(_readable(exc, given)) from None


def priority_from(value: object) -> int:
    """Validate a request's ``priority``; raises ``InvalidSamplingOptions`` naming it."""
    try:
        return msgspec.convert(value, Priority)
    except msgspec.ValidationError as exc:
        text = str(exc)
        got = "" if ", got" in text else f", got {value!r}"
        raise InvalidSamplingOptions(f"priority: {text[:1].lower()}{text[1:]}{got}") from None
