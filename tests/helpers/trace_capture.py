"""Spans for tests, from OpenTelemetry's own SDK: those of the test process (an
``InMemorySpanExporter`` on the tracer provider installed once per process) and those of
a worker or gateway process (the JSON lines ``KVRELAY_TRACES_FILE`` makes it write)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter: InMemorySpanExporter | None = None


def memory_exporter() -> InMemorySpanExporter:
    """The test process's exporter: a provider is installed once per process (OpenTelemetry
    allows one), and every span this process ends is kept in memory."""
    global _exporter
    if _exporter is None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        _exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
    return _exporter


@dataclass(frozen=True)
class Span:
    """What a test checks of a span, whichever process ended it."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    kind: str
    attributes: dict[str, Any]
    status: str
    events: list[str]
    start_ns: int
    end_ns: int
    service: str


def from_memory(span: ReadableSpan) -> Span:
    assert span.context is not None
    return Span(span.name, span.context.trace_id, span.context.span_id,
                span.parent.span_id if span.parent is not None else None,
                span.kind.name, dict(span.attributes or {}), span.status.status_code.name,
                [event.name for event in span.events], span.start_time or 0, span.end_time or 0,
                str(span.resource.attributes.get("service.name", "")))


def _hex(value: str | None) -> int | None:
    return None if value is None else int(value, 16)


def _iso_ns(text: str) -> int:
    from datetime import datetime

    seconds = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return int(seconds * 1e9)


def from_json(line: str) -> Span:
    data = json.loads(line)
    trace_id = _hex(data["context"]["trace_id"])
    span_id = _hex(data["context"]["span_id"])
    assert trace_id is not None
    assert span_id is not None
    return Span(data["name"], trace_id, span_id, _hex(data.get("parent_id")),
                data["kind"].removeprefix("SpanKind."), data.get("attributes") or {},
                data["status"]["status_code"], [e["name"] for e in data.get("events") or []],
                _iso_ns(data["start_time"]), _iso_ns(data["end_time"]),
                data["resource"]["attributes"].get("service.name", ""))


def read_spans(path: Path) -> list[Span]:
    """The spans written to a traces file so far (none if it does not exist yet)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [from_json(line) for line in text.splitlines() if line.strip()]


def wait_for_spans(path: Path, ready: Callable[[list[Span]], bool],
                   timeout: float = 30.0) -> list[Span]:
    """The file's spans once ``ready`` says so (a run's spans are written as it ends)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = read_spans(path)
        if ready(spans):
            return spans
        if time.monotonic() > deadline:
            names = [s.name for s in spans]
            raise TimeoutError(f"the spans in {path} never got ready: {names}")
        time.sleep(0.05)


def named(spans: list[Span], name: str) -> list[Span]:
    return [span for span in spans if span.name == name]


def one(spans: list[Span], name: str) -> Span:
    found = named(spans, name)
    assert len(found) == 1, f"{len(found)} spans named {name!r} in {[s.name for s in spans]}"
    return found[0]
