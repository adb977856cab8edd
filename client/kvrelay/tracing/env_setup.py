"""A tracer provider built from the standard ``OTEL_*`` variables and ``KVRELAY_TRACES_FILE``.

Used by ``switch`` only once the variables ask for tracing (it imports OpenTelemetry's
SDK). Exporters are found by the names ``OTEL_TRACES_EXPORTER`` uses (``otlp``,
``otlp_proto_http``, ``console``, ...) through the entry points the exporter packages
register, as OpenTelemetry's own auto-configuration finds them; each exporter reads its
own variables (endpoint, headers, protocol). The resource comes from ``OTEL_SERVICE_NAME``
and ``OTEL_RESOURCE_ATTRIBUTES``.

``KVRELAY_TRACES_FILE`` adds a writer of one JSON line per span (OpenTelemetry's own
JSON form of a span), written as each span ends: for a quick look without a collector,
and for tests that read a worker's spans.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import IO, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

__all__ = ["JsonLinesExporter", "install"]

log = logging.getLogger("kvrelay.tracing")


class JsonLinesExporter(SpanExporter):
    """Appends each span to a file as one line of JSON (``ReadableSpan.to_json``)."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
        with self._lock:
            self._file.write(lines)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def install(exporters: Sequence[str], traces_file: str | None, service: str) -> Any:
    """Set up tracing; returns the provider it installed, or None when the application
    already has one (then only the traces file, if any, is added to it). ``service``:
    the service name when the variables give none (OpenTelemetry would say
    "unknown_service")."""
    current = trace.get_tracer_provider()
    if not isinstance(current, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        if traces_file and isinstance(current, TracerProvider):
            current.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(traces_file)))
        return None
    provider = TracerProvider(resource=_resource(service))
    for name in exporters:
        exporter = _exporter(name)
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    if traces_file:
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(traces_file)))
    trace.set_tracer_provider(provider)
    return provider


def _resource(service: str) -> Resource:
    resource = Resource.create()
    name = str(resource.attributes.get(SERVICE_NAME, ""))
    if not name or name.startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    return resource


def _entry_point_name(name: str) -> str:
    """``otlp`` is the gRPC exporter unless ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (or
    ``OTEL_EXPORTER_OTLP_PROTOCOL``) says ``http/protobuf``, as the specification says."""
    if name != "otlp":
        return name
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip()
    return "otlp_proto_http" if protocol == "http/protobuf" else "otlp_proto_grpc"


def _exporter(name: str) -> SpanExporter | None:
    """The exporter ``OTEL_TRACES_EXPORTER`` calls ``name``; None (and a warning) when it
    is not installed or cannot be made: the other exporters still get the spans."""
    found = list(entry_points(group="opentelemetry_traces_exporter",
                              name=_entry_point_name(name)))
    if not found:
        log.warning("no span exporter named %r is installed (OTEL_TRACES_EXPORTER); "
                    "install kvrelay[tracing] for otlp", name)
        return None
    try:
        exporter: SpanExporter = found[0].load()()
    except Exception as exc:
        log.warning("could not make the span exporter %r: %s", name, exc)
        return None
    return exporter
