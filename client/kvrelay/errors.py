"""One tree of exceptions for everything the SDK can raise.

``KvrelayError`` is the root. A worker's ``Failed`` event maps to the class registered
for its code, carrying the worker's message, so callers catch what they mean
(``except QueueFull``) rather than parse strings.
"""

from __future__ import annotations

import builtins

from kvrelay.protocol import ErrorCode


class KvrelayError(Exception):
    """Base class of every kvrelay error. ``code`` is the stable wire code."""

    code: str = ErrorCode.INTERNAL

    def __init__(self, message: str, *, job_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.job_id = job_id

    def __str__(self) -> str:
        return self.message if self.job_id is None else f"{self.message} (job {self.job_id})"


class InvalidRequest(KvrelayError, ValueError):
    """The request is malformed or its values are out of range."""

    code = ErrorCode.INVALID_REQUEST


class PromptTooLong(InvalidRequest):
    """The prompt (plus room for one output token) exceeds the model's context length."""

    code = ErrorCode.PROMPT_TOO_LONG


class PayloadTooLarge(InvalidRequest):
    """The encoded request is larger than the worker accepts."""

    code = ErrorCode.PAYLOAD_TOO_LARGE


class ProtocolVersionError(InvalidRequest):
    """Client and worker speak different major versions of the wire protocol."""

    code = ErrorCode.PROTOCOL_VERSION


class UnknownModel(KvrelayError):
    """No worker serves the requested model."""

    code = ErrorCode.UNKNOWN_MODEL


class QueueFull(KvrelayError):
    """The model's queue is longer than the client's ``max_queue``: shed load or retry later."""

    code = ErrorCode.QUEUE_FULL


class DeadlineExceeded(KvrelayError, builtins.TimeoutError):
    """The job's ``timeout`` passed before it finished (or before a worker picked it up)."""

    code = ErrorCode.DEADLINE_EXCEEDED


class Cancelled(KvrelayError):
    """The job was aborted (by this caller or another)."""

    code = ErrorCode.CANCELLED


class WorkerLost(KvrelayError):
    """Workers died while running the job more times than the retry limit allows."""

    code = ErrorCode.WORKER_LOST


class StreamTimeout(KvrelayError, builtins.TimeoutError):
    """No event arrived for the stream's inactivity timeout."""

    code = "stream_timeout"


class ConnectionError(KvrelayError, builtins.ConnectionError):  # the SDK's own name
    """Redis could not be reached (or was lost and could not be re-established)."""

    code = "connection_error"


class InternalError(KvrelayError):
    """The worker hit an unexpected error while running the job."""

    code = ErrorCode.INTERNAL


_BY_CODE: dict[str, type[KvrelayError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        PromptTooLong,
        PayloadTooLarge,
        ProtocolVersionError,
        UnknownModel,
        QueueFull,
        DeadlineExceeded,
        Cancelled,
        WorkerLost,
        InternalError,
    )
}


def error_for_code(code: str, message: str, *, job_id: str | None = None) -> KvrelayError:
    """Build the exception a ``Failed(code, message)`` event stands for."""
    cls = _BY_CODE.get(code, InternalError)
    return cls(message, job_id=job_id)
