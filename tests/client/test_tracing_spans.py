"""The caller's spans of a job, through the SDK on fakeredis with a scripted worker, read
with OpenTelemetry's InMemorySpanExporter: one trace per job, the caller's current span as
its parent, the request carrying the trace's W3C context, the job's end on the span."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.fake_worker import completion_events, emit, play
from helpers.trace_capture import Span, from_memory, memory_exporter, one
from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from kvrelay import AsyncClient
from kvrelay.errors import InternalError, QueueFull
from kvrelay.protocol import (
    Failed,
    Finished,
    GenerateRequest,
    Started,
    Tokens,
    decode_request_json,
    encode_request,
)

pytestmark = pytest.mark.timeout(20)

ROOT = "text_completion m"


@pytest.fixture
def spans() -> Any:
    exporter = memory_exporter()
    exporter.clear()
    yield lambda: [from_memory(s) for s in exporter.get_finished_spans()]
    exporter.clear()


def names_as_parent(trace_context: dict[str, str] | None, span: Span) -> bool:
    """``trace_context``'s traceparent names ``span`` (its flags: sampled, maybe random)."""
    value = (trace_context or {}).get("traceparent", "")
    return value.startswith(f"00-{span.trace_id:032x}-{span.span_id:016x}-")


async def test_a_job_is_one_trace_that_its_request_carries(
        client: AsyncClient, worker: Any, spans: Any) -> None:
    done = await client.generate("hi")
    assert done.text == "Hello"
    found = spans()
    root, admission, delivery = (one(found, name) for name in
                                 (ROOT, "kvrelay.admission", "kvrelay.delivery"))
    assert {s.trace_id for s in found} == {root.trace_id}
    assert root.kind == "CLIENT"
    assert root.parent_id is None
    assert root.status == "UNSET"
    assert admission.kind == "PRODUCER"
    assert admission.parent_id == delivery.parent_id == root.span_id
    assert admission.end_ns <= delivery.start_ns <= delivery.end_ns <= root.end_ns
    (request,) = worker.requests
    assert request.trace_context is not None
    assert set(request.trace_context) == {"traceparent"}
    assert names_as_parent(request.trace_context, root)
    attributes = root.attributes
    assert attributes["gen_ai.operation.name"] == "text_completion"
    assert attributes["gen_ai.request.model"] == "m"
    assert attributes["gen_ai.response.id"] == request.job_id == attributes["kvrelay.job_id"]
    assert attributes["gen_ai.usage.input_tokens"] == 3
    assert attributes["gen_ai.usage.output_tokens"] == 2
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 1
    assert list(attributes["gen_ai.response.finish_reasons"]) == ["stop"]
    assert attributes["kvrelay.worker"] == "fake-worker-1"
    assert attributes["kvrelay.attempt"] == 1
    assert attributes["kvrelay.outcome"] == "finished"
    assert "kvrelay.takeover" not in attributes
    assert root.events == ["kvrelay.started"]


async def test_the_callers_current_span_is_the_parent(
        client: AsyncClient, worker: Any, spans: Any) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("caller") as caller:
        await client.generate(messages=[{"role": "user", "content": "hi"}])
    found = spans()
    root = one(found, "chat m")
    assert root.parent_id == caller.get_span_context().span_id
    assert root.trace_id == caller.get_span_context().trace_id
    assert names_as_parent(worker.requests[0].trace_context, root)


async def test_a_failed_job_marks_the_call_as_an_error(
        client: AsyncClient, worker: Any, spans: Any) -> None:
    async def fails(w: Any, request: GenerateRequest) -> None:
        await play(w.redis, request.job_id, [Started(seq=0, worker="w"),
                                             Failed(seq=1, code="internal", message="boom")])

    worker.behaviour = fails
    with pytest.raises(InternalError):
        await client.generate("hi")
    root = one(spans(), ROOT)
    assert root.status == "ERROR"
    assert root.attributes["error.type"] == "internal"
    assert root.attributes["kvrelay.outcome"] == "failed"


async def test_a_takeover_is_marked_on_the_callers_span(
        client: AsyncClient, worker: Any, spans: Any) -> None:
    async def taken_over(w: Any, request: GenerateRequest) -> None:
        first = completion_events(["a", "b"], worker="w1:1")[:2]
        rest = completion_events(["a", "b"], worker="w2:2")[2:]
        await play(w.redis, request.job_id, first)
        await emit(w.redis, request.job_id, Started(seq=2, worker="w2:2", attempt=2))
        for event in rest:
            event.seq += 1
            await emit(w.redis, request.job_id, event)

    worker.behaviour = taken_over
    await client.generate("hi")
    root = one(spans(), ROOT)
    assert root.attributes["kvrelay.takeover"] is True
    assert root.attributes["kvrelay.attempt"] == 2
    assert root.attributes["kvrelay.worker"] == "w2:2"
    assert root.events == ["kvrelay.started", "kvrelay.started"]


async def test_a_refused_admission_is_an_error_on_both_spans(
        client: AsyncClient, worker: Any, spans: Any) -> None:
    worker.fail_enqueue = QueueFull("full", retry_after=1.0)
    with pytest.raises(QueueFull):
        await client.generate("hi")
    found = spans()
    assert one(found, "kvrelay.admission").status == "ERROR"
    assert one(found, ROOT).status == "ERROR"
    assert not [s for s in found if s.name == "kvrelay.delivery"]


async def test_leaving_early_ends_every_span(
        client: AsyncClient, worker: Any, spans: Any) -> None:
    async def endless(w: Any, request: GenerateRequest) -> None:
        await emit(w.redis, request.job_id, Started(seq=0, worker="w"))
        await emit(w.redis, request.job_id, Tokens(seq=1, token_ids=[1], text="x"))

    worker.behaviour = endless
    async with client.stream("hi") as stream:
        async for _ in stream:
            break
    found = spans()
    assert one(found, ROOT).attributes["kvrelay.outcome"] == "closed"
    assert one(found, "kvrelay.delivery").parent_id == one(found, ROOT).span_id


def _remote_parent(state: TraceState) -> Any:
    parent = SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=state)
    return context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))


@pytest.mark.parametrize(("members", "carried"), [(2, True), (32, False)])
async def test_tracestate_is_carried_only_within_the_bound(
        client: AsyncClient, worker: Any, spans: Any, members: int, carried: bool) -> None:
    state = TraceState([(f"vendor{i}", "x" * 20) for i in range(members)])
    token = _remote_parent(state)
    try:
        await client.generate("hi")
    finally:
        context.detach(token)
    (request,) = worker.requests
    assert request.trace_context is not None
    assert ("tracestate" in request.trace_context) is carried
    assert request.trace_context["traceparent"].startswith(f"00-{0x1234:032x}-")
    # A worker decodes it: the SDK never sends what the wire refuses.
    assert decode_request_json(encode_request(request)).trace_context == request.trace_context
    assert one(spans(), ROOT).trace_id == 0x1234


async def test_finished_events_fill_the_usage(client: AsyncClient, worker: Any,
                                              spans: Any) -> None:
    async def two_choices(w: Any, request: GenerateRequest) -> None:
        events = completion_events([["a"], ["b", "c"]], prompt_tokens=7)
        assert isinstance(events[-1], Finished)
        await play(w.redis, request.job_id, events)

    worker.behaviour = two_choices
    await client.generate("hi", n=2)
    attributes = one(spans(), ROOT).attributes
    assert attributes["gen_ai.request.choice.count"] == 2
    assert attributes["gen_ai.usage.input_tokens"] == 7
    assert attributes["gen_ai.usage.output_tokens"] == 3
    assert list(attributes["gen_ai.response.finish_reasons"]) == ["stop", "stop"]
