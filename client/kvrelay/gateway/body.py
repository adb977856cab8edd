"""Reading a request body under the limits: size checked while reading, a deadline on the
whole body, and JSON nesting checked before the body is parsed.

Starlette's ``request.body()`` would hold any body whole before anyone looked at its size;
``request.stream()`` hands over uvicorn's chunks as they arrive (uvicorn stops reading the
socket while a chunk waits), so at most ``max_body_bytes`` plus one chunk is ever held.
"""

from __future__ import annotations

import asyncio
import itertools

from starlette.requests import ClientDisconnect, Request

from kvrelay.gateway.errors import GatewayError, bad_request
from kvrelay.gateway.limits import RequestLimits

# Every byte that is not a bracket, to be deleted; then '[' '{' count +1 and ']' '}' -1.
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_AS_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"the request body is larger than {limit} bytes",
                        code="request_too_large")


async def read_body(request: Request, limits: RequestLimits) -> bytes:
    """The body, or a ``GatewayError``: 413 past ``max_body_bytes`` (a declared
    Content-Length before anything is read), 408 past ``body_timeout``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise bad_request("Content-Length must be a number of bytes")
        if int(declared) > limits.max_body_bytes:
            raise too_large(limits.max_body_bytes)
    body = bytearray()
    try:
        async with asyncio.timeout(limits.body_timeout):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limits.max_body_bytes:
                    raise too_large(limits.max_body_bytes)
    except TimeoutError:
        raise GatewayError(408, f"the request body did not arrive within "
                                f"{limits.body_timeout:g}s", code="request_timeout") from None
    except ClientDisconnect:
        raise bad_request("the caller left before sending the whole body") from None
    return bytes(body)


def json_depth(body: bytes) -> int:
    """How deeply a JSON text's arrays and objects nest (brackets inside strings not
    counted), in linear C-speed passes whatever the input: escaped backslashes then
    escaped quotes dropped (so every quote left opens or closes a string), the text
    between quote pairs dropped, brackets kept, then a running sum."""
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(unescaped.split(b'"')[::2])
    brackets = outside.translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = memoryview(brackets.translate(_AS_STEPS)).cast("b")
    return max(0, max(itertools.accumulate(steps)))


def check_json_depth(body: bytes, limit: int) -> None:
    """400 when ``body`` nests deeper than ``limit`` (checked before any parsing: a deep
    body would cost the parser, and whatever reads the parsed value, per level)."""
    # Fewer brackets than the limit cannot nest deeper than it: skip the scan.
    if body.count(b"[") + body.count(b"{") <= limit:
        return
    if json_depth(body) > limit:
        raise bad_request(f"the JSON body nests deeper than {limit} levels")
