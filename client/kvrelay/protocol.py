"""The wire contract between clients and workers: every type that crosses Redis.

Rules that keep old and new peers talking:
- Fields are only ever appended, always with a default.
- ``PROTOCOL_MAJOR`` changes only when a peer of the old major could no longer read a
  message; a worker refuses a major it does not speak with a ``protocol_version`` failure.
- Requests travel as JSON (Celery's json serializer; pickle is never accepted). Events
  travel as msgpack, one tagged union, each with the job's ``seq`` (0, 1, 2, ...).

How events move: the worker appends each event to the job's log stream
(``keys.event_log``) with the entry id ``f"{seq}-1"`` and a single field ``e`` holding
the msgpack bytes, then publishes the same bytes on ``keys.events_channel``. Explicit
ids make the log refuse a duplicate ``seq`` and let a reader fetch "everything after
seq N" with ``XRANGE log (N+1)-0 +``. Cancel: the client sets ``keys.abort_flag`` and
publishes an ``AbortMessage`` on ``Keyspace.control_channel``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

import msgspec

PROTOCOL_MAJOR: Final = 1
PROTOCOL_MINOR: Final = 0

# Largest request payload a worker accepts, in bytes of JSON.
DEFAULT_MAX_PAYLOAD_BYTES: Final = 1 << 20

TASK_NAME: Final = "kvrelay.generate"


class ErrorCode:
    """Stable error codes carried by ``Failed`` events (never renamed, only added)."""

    INVALID_REQUEST: ClassVar[str] = "invalid_request"
    UNKNOWN_MODEL: ClassVar[str] = "unknown_model"
    PROMPT_TOO_LONG: ClassVar[str] = "prompt_too_long"
    PAYLOAD_TOO_LARGE: ClassVar[str] = "payload_too_large"
    PROTOCOL_VERSION: ClassVar[str] = "protocol_version"
    DEADLINE_EXCEEDED: ClassVar[str] = "deadline_exceeded"
    CANCELLED: ClassVar[str] = "cancelled"
    WORKER_LOST: ClassVar[str] = "worker_lost"
    QUEUE_FULL: ClassVar[str] = "queue_full"
    INTERNAL: ClassVar[str] = "internal"


# --------------------------------------------------------------------------- requests


class SamplingOptions(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Sampling parameters as sent on the wire; the worker validates them again."""

    n: int = 1
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    logprobs: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    logit_bias: dict[int, float] = msgspec.field(default_factory=dict)


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str
    content: str


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
    priority: int = 0
    # Absolute unix time after which the job must not run (or is aborted if running).
    deadline: float | None = None
    # Separates prefix-cache entries of different tenants.
    cache_salt: str | None = None
    # Unix time the client enqueued the job (for queue-time metrics).
    enqueued_at: float = 0.0


# ----------------------------------------------------------------------------- events


class TopLogprob(msgspec.Struct, array_like=True):
    token_id: int
    logprob: float


class TokenLogprob(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The sampled token's log-probability and the ``logprobs`` most likely alternatives."""

    token_id: int
    logprob: float
    top: list[TopLogprob] = msgspec.field(default_factory=list)


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
    """A worker took the job (again, after a failover: ``attempt`` > 1)."""

    worker: str
    attempt: int = 1
    prompt_tokens: int = 0


class Tokens(Event, tag="tokens", kw_only=True):
    """New tokens of choice ``index`` and the text they add (possibly empty)."""

    token_ids: list[int]
    text: str
    index: int = 0
    logprobs: list[TokenLogprob] | None = None
    # Set on a choice's last Tokens event: why that choice ended ("stop", "length").
    finish_reason: str | None = None


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


ControlMessage = AbortMessage


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


def payload_to_request(payload: object) -> GenerateRequest:
    """Validate a task argument into a ``GenerateRequest`` (raises ``msgspec.ValidationError``)."""
    if isinstance(payload, (bytes, str)):
        return decode_request_json(payload)
    # Round-trip through JSON so validation follows JSON's rules (string dict keys).
    return decode_request_json(_json_encoder.encode(payload))


def log_entry_id(seq: int) -> str:
    """The event log's entry id for ``seq`` (explicit, so a duplicate seq is refused)."""
    return f"{seq}-1"


def seq_of_entry_id(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])
