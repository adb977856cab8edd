"""One job, one trace, across the queue hop and across a takeover.

The caller's spans are read in this process (OpenTelemetry's InMemorySpanExporter); each
real worker process writes its spans as JSON lines to its own ``KVRELAY_TRACES_FILE``.
The caller's span of the job is the parent of the worker's: the request carries its W3C
trace context through the queue, and through the requeued copy a takeover runs, so the
run that takes the job over from a SIGKILLed worker is in the same trace, marked.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.job_log import read_events
from helpers.trace_capture import Span, from_memory, memory_exporter, named, one, wait_for_spans
from helpers.worker_process import WorkerProcess
from opentelemetry import trace

from kvrelay import Client
from kvrelay.protocol import Started

pytestmark = pytest.mark.integration

ROOT = "text_completion llama-mqa"
SHORT: dict[str, Any] = {"prompt_token_ids": [21, 22, 23, 24], "max_tokens": 8, "temperature": 0.0,
         "ignore_eos": True}
LONG: dict[str, Any] = {"prompt_token_ids": [21, 22, 23, 24, 25], "max_tokens": 600, "temperature": 0.0,
        "ignore_eos": True}


@pytest.fixture
def caller_spans() -> Any:
    exporter = memory_exporter()
    exporter.clear()
    yield lambda: [from_memory(s) for s in exporter.get_finished_spans()]
    exporter.clear()


def has_run(attempt: int) -> Callable[[list[Span]], bool]:
    return lambda spans: any(s.name == "kvrelay.run" and s.attributes.get("kvrelay.attempt")
                             == attempt for s in spans)


def test_one_job_is_one_trace_across_the_queue(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str, tmp_path: Path,
        caller_spans: Any) -> None:
    path = tmp_path / "a.spans.jsonl"
    worker = start_worker("a", concurrency=2, traces_file=str(path))
    with Client(clean_redis_url, model="llama-mqa") as client:
        # The synchronous client runs the job on a thread of its own, in this context.
        with trace.get_tracer("test").start_as_current_span("caller") as caller:
            done = client.generate(**SHORT)
    root = one(caller_spans(), ROOT)
    assert root.parent_id == caller.get_span_context().span_id
    spans = wait_for_spans(path, has_run(1))
    assert {s.trace_id for s in spans} == {root.trace_id}
    assert {s.service for s in spans} == {"kvrelay-worker"}
    run, waited = one(spans, "kvrelay.run"), one(spans, "kvrelay.queue_wait")
    assert run.parent_id == waited.parent_id == root.span_id
    assert run.kind == "CONSUMER"
    steps = [one(spans, name) for name in ("kvrelay.claim", "kvrelay.prefill",
                                           "kvrelay.decode", "kvrelay.publish")]
    assert all(step.parent_id == run.span_id for step in steps)
    assert not named(spans, "kvrelay.takeover")
    claim, prefill, decode, publish = steps
    # One machine, one clock: the spans follow the job.
    assert root.start_ns <= waited.start_ns <= waited.end_ns == run.start_ns == claim.start_ns
    assert claim.end_ns == prefill.start_ns <= prefill.end_ns == decode.start_ns
    assert decode.end_ns <= publish.end_ns == run.end_ns
    attributes = run.attributes
    assert attributes["gen_ai.request.model"] == "llama-mqa"
    assert attributes["gen_ai.operation.name"] == "text_completion"
    assert attributes["gen_ai.request.max_tokens"] == 8
    assert attributes["gen_ai.usage.input_tokens"] == 4 == done.usage.prompt_tokens
    assert attributes["gen_ai.usage.output_tokens"] == 8 == done.usage.completion_tokens
    assert list(attributes["gen_ai.response.finish_reasons"]) == ["length"]
    assert attributes["kvrelay.job_id"] == done.job_id
    assert attributes["kvrelay.attempt"] == 1
    assert attributes["kvrelay.takeover"] is False
    assert attributes["kvrelay.outcome"] == "finished"
    assert attributes["kvrelay.worker"] == root.attributes["kvrelay.worker"]
    assert str(worker.pid) in attributes["kvrelay.worker"]
    assert publish.attributes["kvrelay.events"] >= 3  # Started, tokens, Finished


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def test_a_takeover_continues_the_callers_trace(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str, tmp_path: Path,
        caller_spans: Any) -> None:
    paths = {name: tmp_path / f"{name}.spans.jsonl" for name in ("a", "b")}
    workers = {name: start_worker(name, concurrency=4, traces_file=str(path))
               for name, path in paths.items()}
    with Client(clean_redis_url, model="llama-mqa") as client, client.stream(**LONG) as stream:
        for received, _ in enumerate(stream, 1):
            if received == 5:
                started = [e for e in read_events(clean_redis_url, stream.job_id)
                           if isinstance(e, Started)]
                pid = int(started[-1].worker.rsplit(":", 1)[1])
                victim = next(name for name, w in workers.items() if w.pid == pid)
                workers[victim].kill()
                _wait_for(lambda: sum(isinstance(e, Started) for e in
                                      read_events(clean_redis_url, stream.job_id)) > 1,
                          30, "no worker took the job over")
        done = stream.final()
    assert len(done.token_ids) == 600
    root = one(caller_spans(), ROOT)
    assert root.attributes["kvrelay.takeover"] is True
    assert root.attributes["kvrelay.attempt"] == 2
    survivor = next(name for name in workers if name != victim)
    spans = wait_for_spans(paths[survivor], has_run(2))
    assert {s.trace_id for s in spans} == {root.trace_id}
    run = one(spans, "kvrelay.run")
    assert run.parent_id == root.span_id
    assert run.attributes["kvrelay.takeover"] is True
    assert run.attributes["kvrelay.outcome"] == "finished"
    assert run.attributes["kvrelay.worker"] == root.attributes["kvrelay.worker"]
    takeover = one(spans, "kvrelay.takeover")
    assert takeover.parent_id == run.span_id
    assert takeover.attributes["kvrelay.attempt"] == 2
    assert takeover.attributes["kvrelay.prior_tokens"] >= 5
    assert takeover.attributes["kvrelay.resumed_at_seq"] >= 6  # Started + 5 token events
    # The requeued copy is not waited for as a new job: no queue wait of its own.
    assert not named(spans, "kvrelay.queue_wait")
    # The killed worker wrote nothing of its run: its spans were to be made at its end.
    assert not [s for s in wait_for_spans(paths[victim], lambda s: True, 1)
                if s.trace_id == root.trace_id and s.name == "kvrelay.run"]
