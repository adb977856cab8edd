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
from enum import StrEnum
from typing import Annotated, Any, Final

import msgspec
from msgspec import Meta

from kvrelay.adapter_wire import (  # re-exported: the adapters' part of the contract
    MAX_ADAPTER_NAME_CHARS as MAX_ADAPTER_NAME_CHARS,
)
from kvrelay.adapter_wire import AdapterInfo as AdapterInfo
from kvrelay.adapter_wire import AdapterMessage as AdapterMessage
from kvrelay.adapter_wire import AdapterName as AdapterName
from kvrelay.adapter_wire import AdapterResult as AdapterResult
from kvrelay.sampling_wire import (  # re-exported: the sampling part of the contract
    DEFAULT_MAX_TOKENS as DEFAULT_MAX_TOKENS,
)
from kvrelay.sampling_wire import MAX_BEAM_WIDTH as MAX_BEAM_WIDTH
from kvrelay.sampling_wire import MAX_CHOICE_CHARS as MAX_CHOICE_CHARS
from kvrelay.sampling_wire import MAX_CHOICES as MAX_CHOICES
from kvrelay.sampling_wire import MAX_FORMAT_NAME_CHARS as MAX_FORMAT_NAME_CHARS
from kvrelay.sampling_wire import MAX_LENGTH_PENALTY as MAX_LENGTH_PENALTY
from kvrelay.sampling_wire import MAX_LOGIT_BIAS as MAX_LOGIT_BIAS
from kvrelay.sampling_wire import MAX_LOGIT_BIAS_ENTRIES as MAX_LOGIT_BIAS_ENTRIES
from kvrelay.sampling_wire import MAX_LOGPROBS as MAX_LOGPROBS
from kvrelay.sampling_wire import MAX_N as MAX_N
from kvrelay.sampling_wire import MAX_OCCURRENCE_PENALTY as MAX_OCCURRENCE_PENALTY
from kvrelay.sampling_wire import MAX_PATTERN_CHARS as MAX_PATTERN_CHARS
from kvrelay.sampling_wire import MAX_PRIORITY as MAX_PRIORITY
from kvrelay.sampling_wire import MAX_REPETITION_PENALTY as MAX_REPETITION_PENALTY
from kvrelay.sampling_wire import MAX_SEED as MAX_SEED
from kvrelay.sampling_wire import MAX_STOP_STRING_CHARS as MAX_STOP_STRING_CHARS
from kvrelay.sampling_wire import MAX_STOP_STRINGS as MAX_STOP_STRINGS
from kvrelay.sampling_wire import MAX_STOP_TOKEN_IDS as MAX_STOP_TOKEN_IDS
from kvrelay.sampling_wire import MAX_TEMPERATURE as MAX_TEMPERATURE
from kvrelay.sampling_wire import MAX_TOKEN_ID as MAX_TOKEN_ID
from kvrelay.sampling_wire import MAX_TOKENS_LIMIT as MAX_TOKENS_LIMIT
from kvrelay.sampling_wire import MAX_TOP_K as MAX_TOP_K
from kvrelay.sampling_wire import MIN_PRIORITY as MIN_PRIORITY
from kvrelay.sampling_wire import MIN_SEED as MIN_SEED
from kvrelay.sampling_wire import SAMPLING_FIELDS as SAMPLING_FIELDS
from kvrelay.sampling_wire import ChoiceFormat as ChoiceFormat
from kvrelay.sampling_wire import InvalidSamplingOptions as InvalidSamplingOptions
from kvrelay.sampling_wire import JsonObjectFormat as JsonObjectFormat
from kvrelay.sampling_wire import JsonSchemaFormat as JsonSchemaFormat
from kvrelay.sampling_wire import JsonSchemaSpec as JsonSchemaSpec
from kvrelay.sampling_wire import LogitBias as LogitBias
from kvrelay.sampling_wire import OccurrencePenalty as OccurrencePenalty
from kvrelay.sampling_wire import Priority as Priority
from kvrelay.sampling_wire import Probability as Probability
from kvrelay.sampling_wire import RegexFormat as RegexFormat
from kvrelay.sampling_wire import ResponseFormat as ResponseFormat
from kvrelay.sampling_wire import SamplingOptions as SamplingOptions
from kvrelay.sampling_wire import StopString as StopString
from kvrelay.sampling_wire import TextFormat as TextFormat
from kvrelay.sampling_wire import TokenCount as TokenCount
from kvrelay.sampling_wire import TokenId as TokenId
from kvrelay.sampling_wire import priority_from as priority_from
from kvrelay.sampling_wire import sampling_options_from as sampling_options_from
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
