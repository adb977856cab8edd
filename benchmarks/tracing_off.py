"""What tracing costs a job while it is off, and what it costs once it is on.

The SDK asks ``kvrelay.tracing`` once per job whether to trace (``begin_job_trace``) and
the synchronous client once per call (``in_callers_context``). Measured here, in one
process, against a whole job through the SDK (``AsyncClient.generate`` on fakeredis, a
stand-in worker answering Started + one token + Finished at once):

- off, OpenTelemetry not imported by anyone (no ``opentelemetry`` installed);
- off, OpenTelemetry imported but no tracer provider installed (redis-py 8 imports it
  itself when it is installed);
- on: a tracer provider with an in-memory exporter (the three spans of a job made,
  ended and exported), alone (``on_trace_us``) and within a job.

    python benchmarks/tracing_off.py [--jobs 2000] [--calls 200000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

import fakeredis
from harness import write_result

from kvrelay import AsyncClient, event_log
from kvrelay.event_frames import pack_events, pack_message, pack_pair
from kvrelay.keys import Keyspace
from kvrelay.protocol import (
    AnyEvent,
    Finished,
    GenerateRequest,
    Started,
    Tokens,
    encode_event,
)
from kvrelay.tracing.caller_context import in_callers_context
from kvrelay.tracing.job_trace import begin_job_trace

KEYS = Keyspace()


def per_call_ns(fn: Callable[[], object], calls: int) -> float:
    """The best of five rounds of ``calls`` calls, in ns per call."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / calls)
    return best


def hidden_api(fn: Callable[[], float]) -> float:
    """``fn()`` as if OpenTelemetry had never been imported (its trace API hidden)."""
    saved = sys.modules.pop("opentelemetry.trace", None)
    try:
        return fn()
    finally:
        if saved is not None:
            sys.modules["opentelemetry.trace"] = saved


async def job_us(jobs: int) -> float:
    """µs per ``generate`` through the SDK, the stand-in worker answering at once."""
    redis = fakeredis.aioredis.FakeRedis(server=fakeredis.FakeServer())

    async def answer(request: GenerateRequest) -> None:
        events: list[AnyEvent] = [Started(seq=0, worker="w"), Tokens(seq=1, token_ids=[1], text="x"),
                  Finished(seq=2, finish_reason="stop")]
        for event in events:
            data = encode_event(event)
            await event_log.add_entry(redis, KEYS.event_log(request.job_id), event.seq,
                                      pack_events([data]), terminal=isinstance(event, Finished))
            await redis.publish(request.reply_to or "",
                                pack_message([pack_pair(request.job_id, pack_events([data]))]))

    client = AsyncClient(model="m", require_worker=False, redis=redis, enqueuer=answer)
    for _ in range(50):  # warm up: scripts loaded, dispatcher subscribed
        await client.generate("hi")
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(jobs):
            await client.generate("hi")
        best = min(best, (time.perf_counter() - start) / jobs * 1e6)
    await client.aclose()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--out", default="benchmarks/results/tracing_off.json")
    args = parser.parse_args()
    request = GenerateRequest(job_id="j", model="m", prompt="hi")

    def check() -> float:
        return per_call_ns(lambda: begin_job_trace(request), args.calls)

    def carry() -> float:
        def call() -> None:
            coro: Any = asyncio.sleep(0)
            in_callers_context(coro).close()
        return per_call_ns(call, args.calls) - per_call_ns(lambda: asyncio.sleep(0).close(),
                                                           args.calls)

    import opentelemetry.trace  # noqa: F401 - as redis-py 8 does when it is installed

    figures: dict[str, Any] = {
        "off_unimported_check_ns": hidden_api(check),
        "off_imported_check_ns": check(),
        "off_sync_call_carry_ns": carry(),
        "job_off_us": asyncio.run(job_us(args.jobs)),
    }
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    figures["job_on_us"] = asyncio.run(job_us(args.jobs))
    assert exporter.get_finished_spans(), "tracing was not on"

    def whole_trace() -> None:
        job_trace = begin_job_trace(request)
        assert job_trace is not None
        job_trace.carrier()
        job_trace.admitted()
        job_trace.end(None, closed=False)

    figures["on_trace_us"] = per_call_ns(whole_trace, max(1, args.calls // 100)) / 1e3
    exporter.clear()
    figures["off_share_of_job"] = figures["off_imported_check_ns"] / (figures["job_off_us"] * 1e3)

    print(f"{'measure':40} {'value':>12}")
    for name, value in figures.items():
        print(f"{name:40} {value:12.4g}")
    write_result(args.out, "tracing_off", args, figures)


if __name__ == "__main__":
    main()
