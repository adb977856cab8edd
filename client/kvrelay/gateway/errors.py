"""Every failure as OpenAI's error JSON with the status an OpenAI client expects."""

from __future__ import annotations

import math
import uuid
from typing import Any

import msgspec

from kvrelay.errors import (
    BrokerUnavailable,
    Cancelled,
    DeadlineExceeded,
    InvalidRequest,
    KvrelayError,
    QueueFull,
    SlowReader,
    StreamTimeout,
    UnknownModel,
    WorkerLost,
)


class GatewayError(Exception):
    """An error answered as ``{"error": {...}}`` with ``status`` (and extra headers)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }

    def json(self) -> bytes:
        return msgspec.json.encode(self.body())


def from_kvrelay(exc: KvrelayError, *, retry_after: int, any_worker: bool = True) -> GatewayError:
    """The HTTP form of an SDK error; ``any_worker`` False turns an unknown model into 503."""
    message = str(exc)
    if isinstance(exc, InvalidRequest):
        return GatewayError(400, message, code=exc.code)
    if isinstance(exc, UnknownModel):
        if not any_worker:
            return GatewayError(503, message, kind="service_unavailable", code="no_worker")
        return GatewayError(404, message, code="model_not_found", param="model")
    if isinstance(exc, QueueFull):
        # The longer of the gateway's hint and the refusal's own (a tenant's rate says
        # when its next admission is due).
        wait = max(retry_after, math.ceil(exc.retry_after or 0))
        return GatewayError(429, message, kind="rate_limit_error", code=exc.code,
                            headers={"Retry-After": str(wait)})
    if isinstance(exc, BrokerUnavailable):
        return GatewayError(503, message, kind="service_unavailable", code="broker_unavailable")
    if isinstance(exc, WorkerLost):
        return GatewayError(503, message, kind="service_unavailable", code=exc.code)
    if isinstance(exc, (DeadlineExceeded, StreamTimeout)):
        return GatewayError(504, message, kind="timeout", code=exc.code)
    if isinstance(exc, SlowReader):
        return GatewayError(408, message, kind="timeout", code=exc.code)
    if isinstance(exc, Cancelled):
        return GatewayError(409, message, kind="cancelled", code=exc.code)
    return GatewayError(500, message, kind="server_error", code=exc.code)


def internal_error(request_id: str) -> GatewayError:
    """A 500 that names the request (its details are in the gateway's log under this id),
    never the exception's text: that may hold a worker's internals."""
    return GatewayError(500, f"internal error (request id {request_id})", kind="server_error",
                        code="internal_error", headers={"X-Request-Id": request_id})


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex}"


def bad_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, code="invalid_request", param=param)
