"""When the SDK traces: off (and no OpenTelemetry module imported by kvrelay) unless
OpenTelemetry's SDK is configured; the standard ``OTEL_*`` variables or ``KVRELAY_TRACES_FILE`` turn it on.

Each case runs one job in a fresh process (a tracer provider is installed once per
process, so "off" can only be seen in one that never had one): fakeredis, and an
enqueuer that records the request and refuses it, so the job ends at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.trace_capture import one, read_spans

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import asyncio, json, sys
import fakeredis
from kvrelay import AsyncClient
from kvrelay.errors import QueueFull
from kvrelay.tracing import switch

def otel_modules():
    return {m for m in sys.modules if m.startswith("opentelemetry")}

# redis-py imports parts of OpenTelemetry itself when it is installed: what kvrelay adds
# is counted from here.
before = otel_modules()
seen = []

async def enqueue(request):
    seen.append(request)
    raise QueueFull("recorded", retry_after=1.0)

async def main():
    redis = fakeredis.aioredis.FakeRedis(server=fakeredis.FakeServer())
    client = AsyncClient(model="m", require_worker=False, redis=redis, enqueuer=enqueue)
    try:
        await client.generate("hi")
    except QueueFull:
        pass
    await client.aclose()

asyncio.run(main())
switch.flush()
with open(sys.argv[1], "w") as out:
    json.dump({"trace_context": seen[0].trace_context, "summary": switch.summary(),
               "imported": sorted(otel_modules() - before)},
              out)
"""


def run_job(tmp_path: Path, **env: str) -> tuple[dict[str, Any], str]:
    """Run the script with only ``env`` of the tracing variables set; (result, output).
    ``imported``: the OpenTelemetry modules imported since kvrelay and redis were."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("OTEL_") and k != "KVRELAY_TRACES_FILE"}
    result_path = tmp_path / "result.json"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(result_path)],
                          env={**clean, **env}, capture_output=True, text=True, timeout=100,
                          check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(result_path.read_text())
    return result, done.stdout + done.stderr


def test_off_by_default_and_opentelemetry_never_imported(tmp_path: Path) -> None:
    result, _ = run_job(tmp_path)
    assert result == {"trace_context": None, "summary": "off", "imported": []}


@pytest.mark.parametrize("env", [
    {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"},
    {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
    {"OTEL_SERVICE_NAME": "billing"},  # names a service, asks for no exporter
])
def test_variables_that_ask_for_no_exporter_leave_it_off(tmp_path: Path,
                                                         env: dict[str, str]) -> None:
    result, _ = run_job(tmp_path, **env)
    assert result == {"trace_context": None, "summary": "off", "imported": []}


def test_the_standard_variables_turn_it_on(tmp_path: Path) -> None:
    result, output = run_job(tmp_path, OTEL_TRACES_EXPORTER="console",
                             OTEL_SERVICE_NAME="billing")
    assert result["summary"] == "on (console)"
    assert result["trace_context"]["traceparent"].startswith("00-")
    assert '"name": "kvrelay.admission"' in output
    assert '"service.name": "billing"' in output


def test_a_traces_file_gets_a_json_line_per_span(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    # An exporter that is not installed is reported; the file still gets every span.
    result, output = run_job(tmp_path, KVRELAY_TRACES_FILE=str(path),
                             OTEL_TRACES_EXPORTER="no_such_exporter")
    assert "no span exporter named 'no_such_exporter'" in output
    assert result["summary"] == f"on (no_such_exporter, file {path})"
    spans = read_spans(path)
    root = one(spans, "text_completion m")
    assert root.status == "ERROR"
    assert root.attributes["error.type"] == "queue_full"
    assert root.service == "kvrelay"
    assert one(spans, "kvrelay.admission").parent_id == root.span_id
    assert result["trace_context"]["traceparent"].startswith(f"00-{root.trace_id:032x}-")
