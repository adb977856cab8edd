"""Check a task's payload and turn it into what the engine takes, or say precisely why not.

Every refusal is a ``JobRejected`` with a stable code from ``ErrorCode``; the worker
reports it as a ``Failed`` event and moves on. Nothing here may raise anything else for
any input: the fuzz tests send random bytes, wrong types and huge prompts through it.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from kvrelay.protocol import PROTOCOL_MAJOR, ErrorCode, GenerateRequest, decode_request_json
from kvrelay_worker.engine.chat import apply_chat_template
from kvrelay_worker.engine.errors import EngineInputError, PromptTooLongError
from kvrelay_worker.engine.prompt import Prompt, prompt_token_ids
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.tools.model_parsers import ModelParsers
from kvrelay_worker.intake.tool_request import ToolRequestError, plan_and_reasoning

# How much of an unexpected decoding error's text goes into the Failed event.
_MAX_REASON_CHARS = 300


class JobRejected(Exception):
    """A job the worker will not run; ``code`` goes on the wire."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def reply_to_of(payload: object) -> str:
    """The ``reply_to`` of a payload that may be invalid otherwise ('' when it has none):
    where the refusal of a job the worker cannot decode is published."""
    parsed: object = payload
    if isinstance(payload, (str, bytes)):
        try:
            parsed = msgspec.json.decode(payload)
        except Exception:  # a lone surrogate fails to encode, like any other defect
            return ""
    reply_to = parsed.get("reply_to") if isinstance(parsed, dict) else None
    return reply_to if isinstance(reply_to, str) else ""


def decode_payload(payload: object, task_id: str, model: str,
                   max_bytes: int) -> tuple[GenerateRequest, str]:
    """Validate the task argument; return the request and its JSON (kept for failover).

    Whatever decoding raises becomes ``invalid_request``: a lone surrogate fails to encode,
    deep nesting exhausts the recursion limit, and an escaped exception would end the task
    without the caller ever hearing of it.
    """
    try:
        return _decode_payload(payload, task_id, model, max_bytes)
    except JobRejected:
        raise
    except Exception as exc:  # RecursionError, UnicodeEncodeError, whatever else
        reason = f"{type(exc).__name__}: {exc}"[:_MAX_REASON_CHARS]
        raise JobRejected(ErrorCode.INVALID_REQUEST,
                          f"payload could not be decoded: {reason}") from None


def _decode_payload(payload: object, task_id: str, model: str,
                    max_bytes: int) -> tuple[GenerateRequest, str]:
    try:
        # Python's json, not msgspec's encoder: that one writes NaN and inf as null, which
        # an "int or None" option would then take for "not given".
        raw = payload if isinstance(payload, (str, bytes)) else json.dumps(
            payload, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode()
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise JobRejected(ErrorCode.INVALID_REQUEST, f"payload is not JSON-encodable: {exc}") from None
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise JobRejected(ErrorCode.PAYLOAD_TOO_LARGE,
                          f"payload is {size} bytes; the limit is {max_bytes}")
    try:
        parsed = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise JobRejected(ErrorCode.INVALID_REQUEST, f"payload is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise JobRejected(ErrorCode.INVALID_REQUEST,
                          f"payload must be a JSON object, got {type(parsed).__name__}")
    major = parsed.get("protocol_major", PROTOCOL_MAJOR)
    if major != PROTOCOL_MAJOR:
        raise JobRejected(ErrorCode.PROTOCOL_VERSION,
                          f"request speaks protocol {major!r}; this worker speaks {PROTOCOL_MAJOR}")
    try:
        request = decode_request_json(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise JobRejected(ErrorCode.INVALID_REQUEST, f"invalid request: {exc}") from None
    if request.job_id != task_id:
        raise JobRejected(ErrorCode.INVALID_REQUEST,
                          f"job_id {request.job_id!r} does not match the task id {task_id!r}")
    if request.model != model:
        raise JobRejected(ErrorCode.UNKNOWN_MODEL,
                          f"this worker serves {model!r}, not {request.model!r}")
    given = [request.prompt is not None, request.messages is not None,
             request.prompt_token_ids is not None]
    if sum(given) != 1:
        raise JobRejected(ErrorCode.INVALID_REQUEST,
                          "exactly one of prompt, messages, prompt_token_ids must be given")
    return request, raw.decode() if isinstance(raw, bytes) else raw


def sampling_params_from(request: GenerateRequest,
                         parsers: ModelParsers | None = None) -> SamplingParams:
    """The engine's form of the request's options (decoding already enforced their bounds),
    with its tool plan and reasoning parser for a model that writes ``parsers``' syntax."""
    try:
        params = SamplingParams.from_options(request.sampling)
        params.tool_plan, params.reasoning_parser = plan_and_reasoning(
            request, parsers or ModelParsers())
    except ToolRequestError as exc:
        raise JobRejected(exc.code, str(exc)) from None
    except EngineInputError as exc:
        raise JobRejected(ErrorCode.INVALID_REQUEST, str(exc)) from None
    return params


def prompt_ids_for(request: GenerateRequest, tokenizer: Any, vocab_size: int,
                   max_model_len: int) -> list[int]:
    """Tokens of the prompt (chat template applied to messages), checked against the model."""
    prompt: Prompt
    try:
        if request.messages is not None:
            messages = [msgspec.to_builtins(m) for m in request.messages]
            prompt = apply_chat_template(tokenizer, messages, tools=request.tools,
                                         template_kwargs=request.chat_template_kwargs,
                                         reasoning_effort=request.reasoning_effort)
        else:
            prompt = request.prompt if request.prompt is not None else (
                request.prompt_token_ids or [])
        return prompt_token_ids(prompt, tokenizer, vocab_size, max_model_len)
    except PromptTooLongError as exc:
        raise JobRejected(ErrorCode.PROMPT_TOO_LONG, str(exc)) from None
    except EngineInputError as exc:
        raise JobRejected(ErrorCode.INVALID_REQUEST, str(exc)) from None
    except Exception as exc:  # a chat template blowing up on odd input
        raise JobRejected(ErrorCode.INVALID_REQUEST, f"could not tokenize the prompt: {exc}") from None
