"""``GenerateRequest.trace_context``: bounded on the wire, read back by the worker's
decoder, and no part of what makes two requests the same job."""

from __future__ import annotations

import msgspec
import pytest

from kvrelay.protocol import (
    GenerateRequest,
    decode_request_json,
    encode_request,
    request_digest,
)
from kvrelay.trace_wire import MAX_TRACE_FIELDS, MAX_TRACE_VALUE_CHARS
from kvrelay.tracing.carrier import bounded, parent_context

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _json(trace_context: object) -> bytes:
    return msgspec.json.encode({"job_id": "j", "model": "m", "prompt": "hi",
                                "trace_context": trace_context})


def test_a_trace_context_travels_and_an_old_request_has_none() -> None:
    request = GenerateRequest(job_id="j", model="m", prompt="hi",
                              trace_context={"traceparent": PARENT, "tracestate": "a=1"})
    assert decode_request_json(encode_request(request)).trace_context == request.trace_context
    assert decode_request_json(_json(None)).trace_context is None
    assert b"trace_context" not in encode_request(GenerateRequest(job_id="j", model="m",
                                                                  prompt="hi"))


@pytest.mark.parametrize("trace_context", [
    {f"k{i}": "v" for i in range(MAX_TRACE_FIELDS + 1)},
    {"tracestate": "x" * (MAX_TRACE_VALUE_CHARS + 1)},
    {"k" * 65: "v"},
    {"traceparent": 7},
    ["traceparent", PARENT],
])
def test_a_trace_context_past_its_bounds_is_refused(trace_context: object) -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_request_json(_json(trace_context))


def test_a_retry_from_another_trace_is_the_same_job() -> None:
    plain = GenerateRequest(job_id="j", model="m", prompt="hi")
    traced = msgspec.structs.replace(plain, trace_context={"traceparent": PARENT})
    assert request_digest(plain) == request_digest(traced)
    other = msgspec.structs.replace(plain, prompt="ho", trace_context={"traceparent": PARENT})
    assert request_digest(other) != request_digest(traced)


def test_the_carrier_keeps_only_w3c_headers_that_fit() -> None:
    assert bounded({"traceparent": PARENT, "baggage": "a=1",
                    "tracestate": "x" * (MAX_TRACE_VALUE_CHARS + 1)}) == {"traceparent": PARENT}


def test_a_bad_traceparent_starts_a_trace_of_its_own() -> None:
    from opentelemetry import trace

    good = trace.get_current_span(parent_context({"traceparent": PARENT})).get_span_context()
    assert good.is_valid
    assert good.is_remote
    assert good.trace_id == 0x0af7651916cd43dd8448eb211c80319c
    for bad in (None, {}, {"traceparent": "00-zz-01"}, {"tracestate": "a=1"}):
        assert not trace.get_current_span(parent_context(bad)).get_span_context().is_valid
