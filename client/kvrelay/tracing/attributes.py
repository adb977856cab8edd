"""Span names and attributes of a job, the same on the caller's side and the worker's.

Attribute names follow OpenTelemetry's GenAI semantic conventions where one fits
(``gen_ai.*``), so tools that read model-call spans read these; kvrelay's own facts (the
job, its attempt, the worker, how the run ended) are under ``kvrelay.*``. The names are
written here rather than imported from ``opentelemetry-semantic-conventions``, whose
GenAI module is still "incubating" and moves between releases.
"""

from __future__ import annotations

from typing import Final

from kvrelay.protocol import Failed, Finished, GenerateRequest

__all__ = [
    "ATTEMPT",
    "JOB_ID",
    "OUTCOME",
    "TAKEOVER",
    "WORKER",
    "operation_of",
    "request_attributes",
    "span_name",
    "usage_attributes",
]

Attributes = dict[str, str | bool | int | float | list[str]]

# OpenTelemetry GenAI semantic conventions.
OPERATION: Final = "gen_ai.operation.name"
PROVIDER: Final = "gen_ai.provider.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
TEMPERATURE: Final = "gen_ai.request.temperature"
TOP_P: Final = "gen_ai.request.top_p"
TOP_K: Final = "gen_ai.request.top_k"
SEED: Final = "gen_ai.request.seed"
CHOICE_COUNT: Final = "gen_ai.request.choice.count"
RESPONSE_ID: Final = "gen_ai.response.id"
RESPONSE_MODEL: Final = "gen_ai.response.model"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
CACHED_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
ERROR_TYPE: Final = "error.type"

# kvrelay's own.
JOB_ID: Final = "kvrelay.job_id"
ATTEMPT: Final = "kvrelay.attempt"
TAKEOVER: Final = "kvrelay.takeover"
WORKER: Final = "kvrelay.worker"
OUTCOME: Final = "kvrelay.outcome"
LORA: Final = "kvrelay.lora"
PRIORITY: Final = "kvrelay.priority"
RESUMED_AT_SEQ: Final = "kvrelay.resumed_at_seq"
PRIOR_TOKENS: Final = "kvrelay.prior_tokens"
EVENTS: Final = "kvrelay.events"

PROVIDER_NAME: Final = "kvrelay"


def operation_of(request: GenerateRequest) -> str:
    """The GenAI operation: ``chat`` for messages, else ``text_completion``."""
    return "chat" if request.messages is not None else "text_completion"


def span_name(request: GenerateRequest) -> str:
    """The caller's span of a model call, named as the GenAI conventions name it."""
    return f"{operation_of(request)} {request.model}"


def request_attributes(request: GenerateRequest) -> Attributes:
    """What the request asks for: model, sampling, the job's id."""
    sampling = request.sampling
    attributes: Attributes = {
        OPERATION: operation_of(request),
        PROVIDER: PROVIDER_NAME,
        REQUEST_MODEL: request.model,
        TEMPERATURE: sampling.temperature,
        TOP_P: sampling.top_p,
        RESPONSE_ID: request.job_id,
        JOB_ID: request.job_id,
    }
    if sampling.max_tokens is not None:
        attributes[REQUEST_MAX_TOKENS] = sampling.max_tokens
    if sampling.top_k > 0:
        attributes[TOP_K] = sampling.top_k
    if sampling.seed is not None:
        attributes[SEED] = sampling.seed
    if sampling.n != 1:
        attributes[CHOICE_COUNT] = sampling.n
    if request.lora is not None:
        attributes[LORA] = request.lora
    if request.priority:
        attributes[PRIORITY] = request.priority
    return attributes


def usage_attributes(event: object, model: str) -> Attributes:
    """What the job's terminal event says: usage and finish reasons, or the error code
    (nothing for any other event, or None)."""
    if isinstance(event, Failed):
        return {ERROR_TYPE: event.code}
    if not isinstance(event, Finished):
        return {}
    usage = event.usage
    return {
        RESPONSE_MODEL: model,
        INPUT_TOKENS: usage.prompt_tokens,
        OUTPUT_TOKENS: usage.completion_tokens,
        CACHED_INPUT_TOKENS: usage.cached_tokens,
        FINISH_REASONS: list(event.finish_reasons or [event.finish_reason]),
        TIME_TO_FIRST_CHUNK: event.timings.ttft,
    }
