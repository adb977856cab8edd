"""Bad ``/v1/responses`` bodies are a 400, never a crash: whatever mix of fields and values
arrives, ``parse_request`` either refuses it with a 400 naming a field, or returns SDK
keywords that the SDK itself accepts or refuses as an invalid request (also a 400)."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from kvrelay.errors import InvalidRequest
from kvrelay.gateway.errors import GatewayError
from kvrelay.gateway.responses_api.request import parse_request
from kvrelay.request_builder import build_request

FIELDS = ("input", "instructions", "tools", "tool_choice", "text", "reasoning", "include",
          "top_logprobs", "max_output_tokens", "temperature", "top_p", "parallel_tool_calls",
          "chat_template_kwargs", "metadata", "store", "truncation", "stream", "colour")
# Pieces of well-formed bodies, so that many draws get past the first check.
PIECES: list[Any] = [
    "required", "none", "auto", {"type": "function", "name": "f"},
    [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}],
    [{"type": "function_call_output", "call_id": "c", "output": "sunny"}],
    [{"role": "assistant", "content": [{"type": "output_text", "text": "t"}]}],
    [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]}],
    {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
    {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "f"}]},
    {"effort": "low"}, ["message.output_text.logprobs"], {"enable_thinking": True},
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 10**6) | st.floats(allow_nan=False)
    | st.text(max_size=8) | st.sampled_from(PIECES),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["type", "role", "content", "name", "text", "call_id",
                                       "arguments", "output", "format", "schema"]),
                      inner, max_size=3),
    max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5))
def test_any_body_is_a_request_or_a_400(fields: dict[str, Any]) -> None:
    body = {"model": "m", "input": "hi", **fields}
    try:
        request = parse_request(msgspec.json.encode(body))
    except GatewayError as refused:
        status = refused.status
        request = None
    if request is None:
        assert status == 400
        return
    try:
        build_request(None, {**request.options, "model": "m"}, default_model=None)
    except InvalidRequest:
        pass
