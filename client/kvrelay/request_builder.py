"""Keyword arguments -> a validated ``GenerateRequest``.

Its job is to fail *before* anything is enqueued, with a message naming the argument.
Sampling options and ``priority`` are checked by ``kvrelay.protocol`` (the bounds the
worker enforces, written once); messages and the chat template's keywords by
``kvrelay.chat_inputs``; the rest here (prompt forms, timeouts, payload size).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from kvrelay.adapter_wire import adapter_name_error
from kvrelay.chat_inputs import chat_fields_from, messages_from
from kvrelay.errors import InvalidRequest, PayloadTooLarge
from kvrelay.protocol import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    SAMPLING_FIELDS,
    ChatMessage,
    GenerateRequest,
    InvalidSamplingOptions,
    NamedToolChoice,
    ResponseFormat,
    ToolSpec,
    encode_request,
    priority_from,
    sampling_options_from,
)
from kvrelay.queue_push import MAX_QUEUE_TIMEOUT_S

__all__ = ["GenerateOptions", "JobSettings", "build_request", "new_job_id"]

# The longest job id accepted from callers (it is part of every key of the job).
MAX_JOB_ID_LENGTH = 128


class GenerateOptions(TypedDict, total=False):
    """Every keyword ``generate``/``stream`` accept besides the positional prompt."""

    # OpenAI's message dicts: role, content (a str, text parts, or None for an assistant),
    # name, tool_calls, tool_call_id, reasoning_content; or ChatMessage structs.
    messages: Sequence[Mapping[str, Any] | ChatMessage]
    prompt_token_ids: Sequence[int]
    model: str
    # Sampling: the wire ``SamplingOptions`` fields (a test keeps the two in step).
    n: int
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    seed: int | None
    stop: str | Sequence[str] | None
    stop_token_ids: Sequence[int] | None
    logprobs: int | None
    ignore_eos: bool
    min_tokens: int
    logit_bias: Mapping[int, float] | None
    best_of: int | None
    beam_width: int
    length_penalty: float
    early_stopping: bool | Literal["never"]
    speculative: bool
    prompt_logprobs: int | None
    # {"type": "json_schema" | "json_object" | "regex" | "choice", ...} (OpenAI's form).
    response_format: Mapping[str, Any] | ResponseFormat | None
    # Chat only (``kvrelay.chat_inputs``): what the model's template reads besides messages.
    tools: Sequence[Mapping[str, Any] | ToolSpec] | None
    tool_choice: str | Mapping[str, Any] | NamedToolChoice | None
    parallel_tool_calls: bool
    chat_template_kwargs: Mapping[str, Any] | None
    reasoning_effort: str | None
    # Scheduling and client-side behaviour.
    priority: int
    timeout: float | None
    cache_salt: str | None
    stream_timeout: float | None
    queue_timeout: float
    job_id: str | None
    # A LoRA adapter of ``model`` to run the job with (docs/adapters.md).
    lora: str | None


_KNOWN_KEYS = frozenset(GenerateOptions.__annotations__)


@dataclass(frozen=True, slots=True)
class JobSettings:
    """Client-side settings of one job that do not travel in the request."""

    # Whole-job limit in seconds (also sent as the request's absolute ``deadline``).
    timeout: float | None
    # Per-call override of the client's inactivity timeout.
    stream_timeout: float | None
    # Per-call override of the client's queue-wait limit (sent as ``queue_deadline``).
    queue_timeout: float | None = None


def new_job_id() -> str:
    """A fresh job id: 32 hex characters, safe inside a Redis hash tag."""
    return uuid.uuid4().hex


# ----------------------------------------------------------------------- primitives


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(
        value
    )


def _float(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_exclusive: bool = False,
) -> float:
    if not _is_number(value):
        raise InvalidRequest(f"{name} must be a finite number, got {value!r}")
    assert isinstance(value, (int, float))
    number = float(value)
    if minimum is not None and (number <= minimum if min_exclusive else number < minimum):
        op = ">" if min_exclusive else ">="
        raise InvalidRequest(f"{name} must be {op} {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise InvalidRequest(f"{name} must be <= {maximum}, got {number}")
    return number


def _int_list(name: str, value: object) -> list[int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidRequest(f"{name} must be a list of ints, got {type(value).__name__}")
    out: list[int] = []
    for i, item in enumerate(value):
        if not _is_int(item) or item < 0:
            raise InvalidRequest(f"{name}[{i}] must be an int >= 0, got {item!r}")
        out.append(item)
    return out


def _job_id(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest("job_id must be a non-empty str")
    if len(value) > MAX_JOB_ID_LENGTH:
        raise InvalidRequest(f"job_id must be at most {MAX_JOB_ID_LENGTH} characters")
    if any(c in value for c in "{}") or any(c.isspace() for c in value):
        raise InvalidRequest("job_id must not contain braces or whitespace")
    return value


# ------------------------------------------------------------------------- building


def build_request(
    prompt: str | None,
    options: Mapping[str, Any],
    *,
    default_model: str | None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    now: float | None = None,
) -> tuple[GenerateRequest, JobSettings]:
    """Validate ``prompt`` and ``options`` into a request; raises ``InvalidRequest``."""
    unknown = set(options) - _KNOWN_KEYS
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")

    messages = options.get("messages")
    token_ids = options.get("prompt_token_ids")
    given = [
        name
        for name, value in (
            ("prompt", prompt),
            ("messages", messages),
            ("prompt_token_ids", token_ids),
        )
        if value is not None
    ]
    if len(given) != 1:
        raise InvalidRequest(
            "give exactly one of prompt, messages, prompt_token_ids"
            + (f" (got {', '.join(given)})" if given else "")
        )
    if prompt is not None and not isinstance(prompt, str):
        raise InvalidRequest(f"prompt must be a str, got {type(prompt).__name__}")
    chat = messages_from(messages) if messages is not None else None
    template = chat_fields_from(options, chat=chat is not None)
    ids = _int_list("prompt_token_ids", token_ids) if token_ids is not None else None
    if ids is not None and not ids:
        raise InvalidRequest("prompt_token_ids must not be empty")

    model: object = options.get("model")
    if model is None:
        model = default_model
    if not isinstance(model, str) or not model:
        raise InvalidRequest("no model: pass model=... to the client or to this call")

    try:
        priority = priority_from(options.get("priority", 0))
        sampling = sampling_options_from(
            {k: v for k, v in options.items() if k in SAMPLING_FIELDS}
        )
    except InvalidSamplingOptions as exc:
        raise InvalidRequest(str(exc)) from None
    timeout = options.get("timeout")
    if timeout is not None:
        timeout = _float("timeout", timeout, minimum=0.0, min_exclusive=True)
    stream_timeout = options.get("stream_timeout")
    if stream_timeout is not None:
        stream_timeout = _float("stream_timeout", stream_timeout, minimum=0.0, min_exclusive=True)
    queue_timeout = options.get("queue_timeout")
    if queue_timeout is not None:
        queue_timeout = queue_timeout_value(queue_timeout)
    cache_salt = options.get("cache_salt")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise InvalidRequest("cache_salt must be a str")
    lora = options.get("lora")
    if lora is not None and (problem := adapter_name_error(lora)) is not None:
        raise InvalidRequest(f"lora: {problem}")
    job_id = options.get("job_id")
    job_id = new_job_id() if job_id is None else _job_id(job_id)

    enqueued_at = time.time() if now is None else now
    try:
        request = GenerateRequest(
            job_id=job_id,
            model=model,
            prompt=prompt,
            messages=chat,
            prompt_token_ids=ids,
            sampling=sampling,
            priority=priority,
            deadline=None if timeout is None else enqueued_at + timeout,
            cache_salt=cache_salt,
            lora=lora,
            enqueued_at=enqueued_at,
            tools=template.tools,
            tool_choice=template.tool_choice,
            parallel_tool_calls=template.parallel_tool_calls,
            chat_template_kwargs=template.chat_template_kwargs,
            reasoning_effort=template.reasoning_effort,
        )
    except ValueError as exc:  # a rule across fields (tool_choice names no tool, ...)
        raise InvalidRequest(str(exc)) from None
    try:
        size = len(encode_request(request))
    except UnicodeEncodeError as exc:  # a lone surrogate, e.g. from os.fsdecode or bad input
        raise InvalidRequest(
            f"the request holds text that is not valid Unicode and cannot be sent as UTF-8 "
            f"(prompt, messages, tools, stop, cache_salt or job_id): {exc}"
        ) from None
    if size > max_payload_bytes:
        raise PayloadTooLarge(
            f"request is {size} bytes of JSON; workers accept at most {max_payload_bytes}"
        )
    return request, JobSettings(
        timeout=timeout, stream_timeout=stream_timeout, queue_timeout=queue_timeout
    )


def queue_timeout_value(value: object) -> float:
    """A valid queue-wait limit: positive, finite, at most ``MAX_QUEUE_TIMEOUT_S``."""
    return _float(
        "queue_timeout", value, minimum=0.0, min_exclusive=True, maximum=MAX_QUEUE_TIMEOUT_S
    )
