"""The Response object: what a whole answer is, and what stream lifecycle events carry."""

from __future__ import annotations

import time
from typing import Any

from kvrelay.gateway.errors import GatewayError
from kvrelay.protocol import Usage


def response_id(job_id: str) -> str:
    return f"resp_{job_id}"


def usage_body(usage: Usage, reasoning_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens,
                                 "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens,
                                                          usage.completion_tokens)},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def status_of(finish_reason: str | None) -> str:
    """A job cut off by its token limit is an incomplete response."""
    return "incomplete" if finish_reason == "length" else "completed"


def error_body(error: GatewayError) -> dict[str, Any]:
    """A failure as a Response's ``error`` (OpenAI's codes: the rest is a server error)."""
    code = "rate_limit_exceeded" if error.status == 429 else "server_error"
    return {"code": code, "message": error.message}


def response_body(*, job_id: str, model: str, created_at: int, echo: dict[str, Any],
                  status: str, output: list[dict[str, Any]] | None = None,
                  usage: dict[str, Any] | None = None,
                  error: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Response: ``status`` in_progress, completed, incomplete or failed."""
    return {
        "id": response_id(job_id),
        "object": "response",
        "created_at": created_at,
        "completed_at": int(time.time()) if status == "completed" else None,
        "model": model,
        "status": status,
        "output": output or [],
        "usage": usage,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
        else None,
        **echo,
    }
