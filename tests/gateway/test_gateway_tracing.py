"""The gateway continues its caller's trace: a request's W3C ``traceparent`` header is the
parent of the job's spans, in the gateway and in the worker that runs the job.

A real gateway and a real worker, each writing its spans to its own
``KVRELAY_TRACES_FILE`` (the gateway told nothing else: the variable turns tracing on).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from helpers.gateway_process import GatewayProcess
from helpers.trace_capture import Span, named, wait_for_spans
from helpers.worker_process import WorkerProcess

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
ROOT = f"text_completion {MODEL}"
# Two callers' spans (trace id, span id), as their own tracing would send them.
CALLERS = {"whole": (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331),
           "streamed": (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7)}


def header(trace_id: int, span_id: int) -> dict[str, str]:
    return {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01", "tracestate": "caller=1"}


def roots(count: int) -> Callable[[list[Span]], bool]:
    return lambda spans: len(named(spans, ROOT)) >= count


def runs(count: int) -> Callable[[list[Span]], bool]:
    return lambda spans: len(named(spans, "kvrelay.run")) >= count


def test_a_traceparent_header_is_the_parent_of_the_jobs_spans(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        tmp_path: Path) -> None:
    worker_file, gateway_file = tmp_path / "worker.jsonl", tmp_path / "gateway.jsonl"
    start_worker(concurrency=2, traces_file=str(worker_file))
    gateway = GatewayProcess(clean_redis_url, tmp_path, "gateway",
                             KVRELAY_TRACES_FILE=str(gateway_file)).start()
    try:
        body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3}
        whole = httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=60,
                           headers=header(*CALLERS["whole"]))
        assert whole.status_code == 200, whole.text
        with httpx.stream("POST", f"{gateway.url}/v1/completions", timeout=60,
                          json={**body, "stream": True},
                          headers=header(*CALLERS["streamed"])) as streamed:
            assert streamed.status_code == 200
            assert "[DONE]" in streamed.read().decode()
        untraced = httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=60)
        assert untraced.status_code == 200, untraced.text
        gateway_spans = wait_for_spans(gateway_file, roots(3))
    finally:
        gateway.stop()
    worker_spans = wait_for_spans(worker_file, runs(3))
    by_trace = {root.trace_id: root for root in named(gateway_spans, ROOT)}
    for trace_id, span_id in CALLERS.values():
        root = by_trace.pop(trace_id)
        assert root.parent_id == span_id
        assert root.service == "kvrelay-gateway"
        (run,) = [s for s in named(worker_spans, "kvrelay.run") if s.trace_id == trace_id]
        assert run.parent_id == root.span_id
    (own,) = by_trace.values()  # no header: a trace of its own, the gateway's span its root
    assert own.parent_id is None
    (run,) = [s for s in named(worker_spans, "kvrelay.run") if s.trace_id == own.trace_id]
    assert run.parent_id == own.span_id
