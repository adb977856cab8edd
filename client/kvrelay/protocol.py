"""The wire contract between clients and workers: every type that crosses Redis.

Rules that keep old and new peers talking:
- Fields are only ever appended, always with a default.
- ``PROTOCOL_MAJOR`` changes only when a peer of the old major could no longer read a
  message; a worker refuses a major it does not speak with a ``protocol_version`` failure.
- Requests travel as JSON (Celery's json serializer; pickle is never accepted). Events
  travel as msgpack, one tagged union, each with the job's ``seq`` (0, 1, 2, ...).

How events move: per batch, the worker appends each job's events to its own tail stream
(``Keyspace.worker_tail``; moved into the job's log, ``Keyspace.event_log``, every few
batches: ``kvrelay.event_log``), then publishes them packed (``kvrelay.event_frames``): one
message per client on the client's ``Keyspace.reply_channel`` (the request's ``reply_to``),
and one on the job's ``Keyspace.events_channel`` while other clients watch it. Cancel: the client sets ``Keyspace.abort_flag``
and publishes an ``AbortMessage`` on ``Keyspace.control_channel``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from kvrelay.adapter_wire import (  # re-exported: the adapters' part of the contract
    MAX_ADAPTER_NAME_CHARS as MAX_ADAPTER_NAME_CHARS,
)
from kvrelay.adapter_wire import AdapterInfo as AdapterInfo
from kvrelay.adapter_wire import AdapterMessage as AdapterMessage
from kvrelay.adapter_wire import AdapterName as AdapterName
from kvrelay.adapter_wire import AdapterResult as AdapterResult
from kvrelay.tool_wire import MAX_SCHEMA_BYTES as MAX_SCHEMA_BYTES
from kvrelay.tool_wire import MAX_TEMPLATE_KWARGS_BYTES as MAX_TEMPLATE_KWARGS_BYTES
from kvrelay.tool_wire import MAX_TOOL_CALLS_PER_MESSAGE as MAX_TOOL_CALLS_PER_MESSAGE
from kvrelay.tool_wire import MAX_TOOL_NAME_CHARS as MAX_TOOL_NAME_CHARS
from kvrelay.tool_wire import MAX_TOOLS as MAX_TOOLS
from kvrelay.tool_wire import FunctionCall as FunctionCall
from kvrelay.tool_wire import FunctionName as FunctionName
from kvrelay.tool_wire import FunctionSpec as FunctionSpec
from kvrelay.tool_wire import NamedToolChoice as NamedToolChoice
from kvrelay.tool_wire import ReasoningEffort as ReasoningEffort
from kvrelay.tool_wire import ToolCall as ToolCall
from kvrelay.tool_wire import ToolCallDelta as ToolCallDelta
from kvrelay.tool_wire import ToolChoice as ToolChoice
from kvrelay.tool_wire import ToolName as ToolName
from kvrelay.tool_wire import ToolSpec as ToolSpec
from kvrelay.trace_wire import TraceContext

PROTOCOL_MAJOR: Final = 3
PROTOCOL_MINOR: Final = 2

# Largest request payload a worker accepts, in bytes of JSON.
DEFAULT_MAX_PAYLOAD_BYTES: Final = 1 << 20

TASK_NAME: Final = "kvrelay.generate"


# Stable error codes carried by ``Failed`` events (never renamed, only added). Each
# member is a ``str`` whose value is its name in lower case: ErrorCode.INVALID_REQUEST
# == "invalid_request" on the wire.
ErrorCode = StrEnum("ErrorCode", [
    "INVALID_REQUEST", "UNKNOWN_MODEL", "PROMPT_TOO_LONG", "PAYLOAD_TOO_LARGE",
    "PROTOCOL_VERSION", "DEADLINE_EXCEEDED", "CANCELLED", "WORKER_LOST", "QUEUE_FULL",
    "QUEUE_TIMEOUT", "INTERNAL", "JOB_ID_REUSED", "LOG_TRUNCATED",
])


# ------------------------------------------------------------------ sampling options
#
# The one place where a sampling option's type, bounds and default are written. The
# SDK's keywords, the worker's payload decoder and the engine's ``SamplingParams`` all
# validate through ``SamplingOptions`` (``sampling_options_from`` for Python values,
# ``decode_request_json`` for the wire), so each accepts exactly what the others do.

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


# --------------------------------------------------------------------------- requests


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One message of a conversation, as OpenAI's chat messages carry it (text only).

    ``tool_calls``: an assistant's calls; ``tool_call_id``: the call a ``tool`` message
    answers; ``reasoning_content``: an assistant's earlier reasoning (templates that
    render it do; the others drop it, as transformers does).
    """

    role: str
    content: str | None = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCall], Meta(max_length=MAX_TOOL_CALLS_PER_MESSAGE)] | None = None
    tool_call_id: Annotated[str, Meta(max_length=128)] | None = None
    reasoning_content: str | None = None


class GenerateRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One generation job. Exactly one of ``prompt``, ``messages``, ``prompt_token_ids``."""

    job_id: str
    model: str
    protocol_major: int = PROTOCOL_MAJOR
    protocol_minor: int = PROTOCOL_MINOR
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    prompt_token_ids: list[int] | None = None
    sampling: SamplingOptions = msgspec.field(default_factory=SamplingOptions)
    # Higher runs first when the engine must choose; FCFS among equals.
    priority: Priority = 0
    # Absolute unix time after which the job must not run (or is aborted if running).
    deadline: float | None = None
    # Separates prefix-cache entries of different tenants.
    cache_salt: str | None = None
    # Unix time the client enqueued the job (for queue-time metrics).
    enqueued_at: float = 0.0
    # Absolute unix time after which no worker may start the job (its caller stops
    # waiting for a pickup then): a worker drops it with ``queue_timeout`` instead.
    queue_deadline: float | None = None
    # The pub/sub channel of the client that sent the job (``Keyspace.reply_channel``):
    # where its events are published, with those of the client's other jobs.
    reply_to: str | None = None
    # Function tools the model may call, and how it must (None: "auto" with tools, else
    # "none"). Rendered by the model's chat template; "required" and a named choice are
    # decoded under a grammar built from the tools' parameter schemas.
    tools: Annotated[list[ToolSpec], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    # False: at most one call per answer.
    parallel_tool_calls: bool = True
    # Extra variables for the chat template (``enable_thinking``, ...), as transformers'
    # ``apply_chat_template(**kwargs)`` takes them.
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: ReasoningEffort | None = None
    # The LoRA adapter (of ``model``) the job runs with; None: the base model alone.
    lora: AdapterName | None = None
    # The caller's W3C trace context (``traceparent``, ``tracestate``; kvrelay.trace_wire):
    # every run of the job, a takeover's too, continues that trace. None: not traced.
    trace_context: TraceContext | None = None

    def __post_init__(self) -> None:
        if self.chat_template_kwargs is not None:
            size = len(msgspec.json.encode(self.chat_template_kwargs))
            if size > MAX_TEMPLATE_KWARGS_BYTES:
                raise ValueError(f"chat_template_kwargs is {size} bytes of JSON, over the "
                                 f"{MAX_TEMPLATE_KWARGS_BYTES} allowed")
        if self.tools is not None:
            names = [t.function.name for t in self.tools]
            if len(set(names)) != len(names):
                raise ValueError("tools: two tools share a name")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            if not any(t.function.name == choice.function.name for t in self.tools or ()):
                raise ValueError(f"tool_choice names {choice.function.name!r}, "
                                 "which is not one of tools")
        elif choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")


# ----------------------------------------------------------------------------- events


class TopLogprob(msgspec.Struct, array_like=True):
    token_id: int
    logprob: float
    # The token's bytes as the tokenizer maps it (a byte-level token may be part of a
    # UTF-8 character); None from a worker that does not send them.
    token_bytes: bytes | None = None

    @property
    def token(self) -> str | None:
        """The token as text (an incomplete UTF-8 piece shows as U+FFFD, as OpenAI's)."""
        return None if self.token_bytes is None else self.token_bytes.decode("utf-8", "replace")


class TokenLogprob(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The sampled token's log-probability and the ``logprobs`` most likely alternatives."""

    token_id: int
    logprob: float
    top: list[TopLogprob] = msgspec.field(default_factory=list)
    token_bytes: bytes | None = None

    @property
    def token(self) -> str | None:
        """The token as text (see ``TopLogprob.token``)."""
        return None if self.token_bytes is None else self.token_bytes.decode("utf-8", "replace")


class PromptLogprob(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A prompt token's log-probability given the tokens before it (with alternatives)."""

    token_id: int
    logprob: float
    top: list[TopLogprob] = msgspec.field(default_factory=list)
    token_bytes: bytes | None = None

    @property
    def token(self) -> str | None:
        return None if self.token_bytes is None else self.token_bytes.decode("utf-8", "replace")


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Prompt tokens served from the prefix cache instead of being computed.
    cached_tokens: int = 0


class Timings(msgspec.Struct, kw_only=True):
    """Seconds: enqueue->pickup, enqueue->first token, first->last token, enqueue->end."""

    queue: float = 0.0
    ttft: float = 0.0
    decode: float = 0.0
    total: float = 0.0


class Event(msgspec.Struct, tag_field="type", kw_only=True):
    """Base of every event; ``seq`` increases by one per event of a job, from 0."""

    seq: int


class Started(Event, tag="started", kw_only=True):
    """A worker took the job (again, after a failover: ``attempt`` > 1). ``run`` is the
    claim's run id (what the job's lease holds, and what its log entries name as their
    writer: ``event_log.RUN_FIELD``); '' from a worker that does not send it."""

    worker: str
    attempt: int = 1
    prompt_tokens: int = 0
    run: str = ""


class Tokens(Event, tag="tokens", kw_only=True, omit_defaults=True):
    """New tokens of choice ``index`` and the text they add (possibly empty)."""

    token_ids: list[int]
    text: str
    index: int = 0
    logprobs: list[TokenLogprob] | None = None
    # Set on a choice's last Tokens event: why that choice ended ("stop", "length").
    finish_reason: str | None = None
    # Also on a choice's last Tokens event, when the worker knows it: the sum of its
    # sampled tokens' log-probabilities (always for best_of, and when logprobs was asked).
    cumulative_logprob: float | None = None
    # Beam search: on each returned beam's (only) Tokens event, its score as transformers'
    # ``sequences_scores`` (sum of logprobs / generated length ** length_penalty).
    beam_score: float | None = None
    # With a reasoning parser: the reasoning text these tokens add (``text`` then carries
    # the answer's text only).
    reasoning: str | None = None
    # With tools: the tool-call pieces these tokens add (their text is not in ``text``).
    tool_calls: list[ToolCallDelta] | None = None
    # Once, on the first Tokens event of choice 0 when ``prompt_logprobs`` was asked:
    # one entry per prompt token, None for the first (nothing precedes it).
    prompt_logprobs: list[PromptLogprob | None] | None = None


class Finished(Event, tag="finished", kw_only=True):
    """The job ended normally; ``finish_reasons`` has one entry per choice."""

    finish_reason: str
    finish_reasons: list[str] = msgspec.field(default_factory=list)
    usage: Usage = msgspec.field(default_factory=Usage)
    timings: Timings = msgspec.field(default_factory=Timings)


class Failed(Event, tag="failed", kw_only=True):
    """The job ended with an error; ``code`` is one of ``ErrorCode``."""

    code: str
    message: str


AnyEvent = Started | Tokens | Finished | Failed

TERMINAL_EVENTS: Final = (Finished, Failed)


class AbortMessage(msgspec.Struct, tag="abort", tag_field="type", kw_only=True):
    """Broadcast on the control channel: stop ``job_id`` wherever it runs."""

    job_id: str


ControlMessage = AbortMessage | AdapterMessage


# ------------------------------------------------------------------------- workers


class WorkerInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A worker's heartbeat (JSON at ``keys.worker_heartbeat``), refreshed every second.

    ``stats`` is the engine's ``stats()`` (running, waiting, free_blocks, total_blocks,
    prefix_cache_hits, prefix_cache_queries, preemptions, max_batch_size, ...).
    """

    worker_id: str
    model: str
    host: str
    pid: int
    device: str = "cpu"
    concurrency: int = 1
    started_at: float = 0.0
    updated_at: float = 0.0
    jobs_running: int = 0
    draining: bool = False
    stats: dict[str, Any] = msgspec.field(default_factory=dict)
    # The largest request payload (bytes of JSON) the worker accepts; 0: not advertised.
    # Clients never send more than the smallest limit the model's workers advertise.
    max_payload_bytes: int = 0
    # Where the worker serves Prometheus metrics (None: not served); the bound port when
    # KVRELAY_METRICS_PORT=0 asked for any free one.
    metrics_port: int | None = None
    # Prefix-aware placement: base64 ``kvrelay.prefix_filter.PrefixFilter`` of the prompt
    # prefixes the worker served recently ('' : none, or a worker without a queue of its
    # own, which placement then never picks).
    prefix_filter: str = ""
    # The LoRA adapters the worker holds, and what it did with the latest adapter
    # control messages (``kvrelay.adapter_wire``).
    adapters: list[AdapterInfo] = msgspec.field(default_factory=list)
    adapter_results: list[AdapterResult] = msgspec.field(default_factory=list)


# ------------------------------------------------------------------------- encoding

_event_encoder = msgspec.msgpack.Encoder()
_event_decoder = msgspec.msgpack.Decoder(AnyEvent)
_control_decoder = msgspec.msgpack.Decoder(ControlMessage)
_json_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(GenerateRequest)


def encode_event(event: AnyEvent) -> bytes:
    return _event_encoder.encode(event)


def decode_event(data: bytes) -> AnyEvent:
    return _event_decoder.decode(data)


def encode_worker_info(info: WorkerInfo) -> bytes:
    return _json_encoder.encode(info)


def decode_worker_info(data: bytes | str) -> WorkerInfo:
    return msgspec.json.decode(data, type=WorkerInfo)


def encode_control(message: ControlMessage) -> bytes:
    return _event_encoder.encode(message)


def decode_control(data: bytes) -> ControlMessage:
    return _control_decoder.decode(data)


def request_to_payload(request: GenerateRequest) -> dict[str, Any]:
    """The Celery task argument for ``request``: plain JSON-compatible builtins."""
    payload: dict[str, Any] = msgspec.to_builtins(request, str_keys=True)
    return payload


def encode_request(request: GenerateRequest) -> bytes:
    return _json_encoder.encode(request)


def decode_request_json(data: bytes | str) -> GenerateRequest:
    return _request_decoder.decode(data)


def request_digest(request: GenerateRequest) -> str:
    """What makes two requests the same job: everything but when and from where they were
    sent (a retry carries a new ``enqueued_at``, ``deadline`` and ``queue_deadline``, and
    from another client process a new ``reply_to``, from another trace a new
    ``trace_context``). Kept with the job
    in place of the prompt, so a reused ``job_id`` is told apart from a retry."""
    timeless = msgspec.structs.replace(
        request, enqueued_at=0.0, deadline=None, queue_deadline=None, reply_to=None,
        trace_context=None,
    )
    # Through the wire form and back, as a worker sees it (``1`` for a float field is
    # ``1.0`` there), so both sides hash the same bytes.
    canonical = decode_request_json(_json_encoder.encode(timeless))
    return hashlib.sha256(_json_encoder.encode(canonical)).hexdigest()
