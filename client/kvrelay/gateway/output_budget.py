"""A whole (non-streamed) answer is held in the gateway until it is complete: its size is
bounded before the job is admitted, from what the request asks for.

One token of one choice is one entry, plus one per alternative when ``logprobs`` asks for
them; a request may ask for ``max(n, best_of) x max_tokens x (1 + logprobs)`` entries.
Streamed answers are forwarded chunk by chunk and never held whole, so they are not
counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvrelay.gateway.errors import GatewayError
from kvrelay.protocol import DEFAULT_MAX_TOKENS


def output_entries(options: Mapping[str, Any]) -> int:
    """The most token entries the answer to these SDK keywords can hold."""
    choices = max(options.get("n") or 1, options.get("best_of") or 1)
    max_tokens = options.get("max_tokens") or DEFAULT_MAX_TOKENS
    logprobs = options.get("logprobs") or 0
    return int(choices) * int(max_tokens) * (1 + int(logprobs))


def check_output_budget(options: Mapping[str, Any], limit: int) -> None:
    """400 for a request whose whole answer could exceed ``limit`` entries."""
    entries = output_entries(options)
    if entries > limit:
        raise GatewayError(
            400, f"this request could produce {entries} token entries "
                 f"(n x max_tokens x (1 + logprobs)); a whole answer may hold at most {limit}: "
                 "ask for fewer, or stream it", code="request_too_large", param="max_tokens")
