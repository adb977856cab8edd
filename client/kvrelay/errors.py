"""One tree of exceptions for everything the SDK can raise.

``KvrelayError`` is the root. A worker's ``Failed`` event maps to the class registered
for its code, carrying the worker's message, so callers catch what they mean
(``except QueueFull``) rather than parse strings.
"""

from __future__ import annotations

import builtins

from kvrelay.protocol import ErrorCode

# The wire's error codes: only these map a ``Failed`` event to a class.
_WIRE_CODES = frozenset(code.value for code in ErrorCode)
_BY_CODE: dict[str, type[KvrelayError]] = {}


class KvrelayError(Exception):
    """Base class of every kvrelay error. ``code`` is the stable wire code.

    A subclass names its code in its header (``class X(KvrelayError, code=...)``); one for
    a wire code becomes what a ``Failed`` event with that code raises.
    """

    code: str = ErrorCode.INTERNAL

    def __init_subclass__(cls, code: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
            if code in _WIRE_CODES:
                _BY_CODE[code] = cls

    def __init__(self, message: str, *, job_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.job_id = job_id

    def __str__(self) -> str:
        return self.message if self.job_id is None else f"{self.message} (job {self.job_id})"


class InvalidRequest(KvrelayError, ValueError, code=ErrorCode.INVALID_REQUEST):
    """The request is malformed or its values are out of range."""


class PromptTooLong(InvalidRequest, code=ErrorCode.PROMPT_TOO_LONG):
    """The prompt (plus room for one output token) exceeds the model's context length."""


class PayloadTooLarge(InvalidRequest, code=ErrorCode.PAYLOAD_TOO_LARGE):
    """The encoded request is larger than the worker accepts."""


class ProtocolVersionError(InvalidRequest, code=ErrorCode.PROTOCOL_VERSION):
    """Client and worker speak different major versions of the wire protocol."""


class JobIdReused(InvalidRequest, code=ErrorCode.JOB_ID_REUSED):
    """The ``job_id`` belongs to a job with a different request (retries must repeat it)."""


class UnknownModel(KvrelayError, code=ErrorCode.UNKNOWN_MODEL):
    """No worker serves the requested model."""


class QueueFull(KvrelayError, code=ErrorCode.QUEUE_FULL):
    """The model's queue is at its limit (the workers' ``KVRELAY_MAX_QUEUE`` or the
    client's ``max_queue``): nothing was enqueued; retry after ``retry_after`` seconds."""

    def __init__(
        self, message: str, *, job_id: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, job_id=job_id)
        self.retry_after = retry_after


class QueueTimeout(KvrelayError, builtins.TimeoutError, code=ErrorCode.QUEUE_TIMEOUT):
    """No worker picked the job up within its ``queue_timeout``; it will never run."""


class DeadlineExceeded(KvrelayError, builtins.TimeoutError, code=ErrorCode.DEADLINE_EXCEEDED):
    """The job's ``timeout`` passed before it finished (or before a worker picked it up)."""


class Cancelled(KvrelayError, code=ErrorCode.CANCELLED):
    """The job was aborted (by this caller or another)."""


class WorkerLost(KvrelayError, code=ErrorCode.WORKER_LOST):
    """Workers died while running the job more times than the retry limit allows."""


class LogTruncated(WorkerLost, code=ErrorCode.LOG_TRUNCATED):
    """A worker died and the job's replay log had lost its start: it cannot be continued."""


class StreamTimeout(KvrelayError, builtins.TimeoutError, code="stream_timeout"):
    """No event arrived for the stream's inactivity timeout."""


class SlowReader(KvrelayError, code="slow_reader"):
    """The stream's reader fell too far behind its job's events (the client's
    ``stream_buffer_bytes``): the stream ends and its job is aborted."""


class BrokerUnavailable(KvrelayError, builtins.ConnectionError, code="connection_error"):
    """Redis could not be reached (or was lost and could not be re-established)."""


class UnknownJob(KvrelayError, LookupError, code="unknown_job"):
    """``resume`` of a job with no trace left: never enqueued, or its log has expired."""


class ControlTimeout(KvrelayError, builtins.TimeoutError, code="control_timeout"):
    """Live workers did not report what they did with a control message (an adapter's
    load or unload) in time; ``kvrelay adapters list`` shows where things stand."""


class InternalError(KvrelayError, code=ErrorCode.INTERNAL):
    """The worker hit an unexpected error while running the job."""


def error_for_code(code: str, message: str, *, job_id: str | None = None) -> KvrelayError:
    """Build the exception a ``Failed(code, message)`` event stands for."""
    cls = _BY_CODE.get(code, InternalError)
    return cls(message, job_id=job_id)
