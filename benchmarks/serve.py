"""Serving overhead on CPU: the same workload through Redis + Celery and in-process, one run.

The workload is offline.py's (``--num-requests`` random prompts of 32..256 tokens, each
asking for 32..128 tokens, greedy, EOS ignored). It runs twice against identical engine
options:

- ``in-process``: an ``LLMEngine`` in this process; all requests added at once, tokens
  timestamped as each ``step()`` returns them.
- ``queue``: a private ``redis-server`` and one real worker process (``kvrelay worker``);
  one ``AsyncClient`` opens all streams at once, tokens timestamped as chunks arrive.

Reported for both: output tokens/s (and the ratio queue / in-process), TTFT, TPOT and ITL
p50/p90/p99. Then, on the now idle machine, ``--idle-requests`` single requests one after
another (16-token prompt, 1 output token), alternating between the two paths, measure the
TTFT the queue adds: p50 through the queue minus p50 in-process; and, measured directly,
the time from the client's enqueue to the worker's pickup (the job's ``timings.queue``).

    python benchmarks/serve.py [--quick] [--out benchmarks/results/serve.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import RequestTrace, percentiles, summarize, worker_stack, write_result
from harness.offline_systems import DEFAULT_MODEL, Workload, make_workload
from harness.offline_systems import serving_engine_options as engine_options

# Pause between idle-latency requests (see ``_idle_ttft``).
_SETTLE_S = 0.5


# ------------------------------------------------------------------------ in-process


def run_in_process(model: str, workload: Workload, options: dict[str, Any]
                   ) -> tuple[dict[str, Any], list[list[int]], Any]:
    from kvrelay_worker.engine import EngineConfig, LLMEngine, SamplingParams

    engine = LLMEngine(EngineConfig(model=model, device="cpu", dtype="float32", **options))
    _drain(engine, [([100 + i] * 20, 4) for i in range(4)])  # warm-up
    traces: dict[str, RequestTrace] = {}
    outputs: dict[str, list[int]] = {}
    start = time.perf_counter()
    for i, (prompt, n) in enumerate(zip(workload.prompts, workload.output_lens, strict=True)):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=n, temperature=0.0,
                                                           ignore_eos=True))
        traces[f"r{i}"] = RequestTrace(sent=start)
        outputs[f"r{i}"] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            now = time.perf_counter()
            for delta in out.deltas:
                if delta.token_ids:
                    traces[out.request_id].add(now, len(delta.token_ids))
                    outputs[out.request_id].extend(delta.token_ids)
    summary = summarize(list(traces.values()), start)
    return summary, [outputs[f"r{i}"] for i in range(len(workload.prompts))], engine


def idle_prompt(i: int) -> list[int]:
    """A 16-token prompt no earlier request shares (no prefix-cache hit)."""
    return [200 + i] + [300 + j for j in range(15)]


def in_process_ttft(engine: Any, i: int) -> float:
    from kvrelay_worker.engine import SamplingParams

    sent = time.perf_counter()
    engine.add_request(f"idle{i}", idle_prompt(i), SamplingParams(max_tokens=1, temperature=0.0,
                                                                    ignore_eos=True))
    first = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if first is None and any(d.token_ids for d in out.deltas):
                first = time.perf_counter()
    assert first is not None
    return first - sent


def _drain(engine: Any, requests: list[tuple[list[int], int]]) -> None:
    from kvrelay_worker.engine import SamplingParams

    for i, (prompt, n) in enumerate(requests):
        engine.add_request(f"warm{i}", prompt, SamplingParams(max_tokens=n, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


# ----------------------------------------------------------------------------- queue


async def _stream_all(url: str, served: str, workload: Workload
                      ) -> tuple[dict[str, Any], list[list[int]]]:
    from kvrelay import AsyncClient

    async with AsyncClient(url, model=served, stream_timeout=300) as client:
        for i in range(4):  # warm-up: client connections, worker code paths
            await client.generate(prompt_token_ids=[100 + i] * 20, max_tokens=4,
                                  ignore_eos=True)
        traces = [RequestTrace(sent=0.0) for _ in workload.prompts]
        outputs: list[list[int]] = [[] for _ in workload.prompts]
        start = time.perf_counter()

        async def one(i: int) -> None:
            traces[i].sent = time.perf_counter()
            async with client.stream(prompt_token_ids=workload.prompts[i],
                                     max_tokens=workload.output_lens[i], temperature=0.0,
                                     ignore_eos=True) as stream:
                async for chunk in stream:
                    if chunk.token_ids:
                        traces[i].add(time.perf_counter(), len(chunk.token_ids))
                        outputs[i].extend(chunk.token_ids)

        await asyncio.gather(*(one(i) for i in range(len(workload.prompts))))
        return summarize(traces, start), outputs


async def _idle_ttft(url: str, served: str, engine: Any, count: int
                     ) -> tuple[list[float], list[float], list[float]]:
    """Single requests one after another, alternating in-process and through the queue, so
    that any drift in the machine's load touches both alike. A pause before each lets the
    previous request's compute threads go idle (OpenMP spins for a while after work), so
    neither path runs while the other's threads still hold the cores."""
    from kvrelay import AsyncClient

    local, queued, pickup = [], [], []
    async with AsyncClient(url, model=served, stream_timeout=60) as client:
        for i in range(count):
            await asyncio.sleep(_SETTLE_S)
            local.append(in_process_ttft(engine, 2 * i))
            await asyncio.sleep(_SETTLE_S)
            sent = time.perf_counter()
            async with client.stream(prompt_token_ids=idle_prompt(2 * i + 1), max_tokens=1,
                                     temperature=0.0, ignore_eos=True) as stream:
                async for chunk in stream:
                    if chunk.token_ids:
                        queued.append(time.perf_counter() - sent)
                        break
                done = await stream.final()
                pickup.append(done.timings.queue)
    return local, queued, pickup


def run_queue(model: str, workload: Workload, options: dict[str, Any], engine: Any,
              idle_requests: int
              ) -> tuple[dict[str, Any], list[list[int]],
                         tuple[list[float], list[float], list[float]], dict[str, Any]]:
    from kvrelay import Client

    settings = {"model": model, "device": "cpu", "dtype": "float32",
                "concurrency": len(workload.prompts), **options}
    with tempfile.TemporaryDirectory(prefix="kvrelay-serve-") as workdir, \
            worker_stack(settings, Path(workdir)) as stack:
        url, served = stack.url, stack.served_model
        summary, outputs = asyncio.run(_stream_all(url, served, workload))
        idle = asyncio.run(_idle_ttft(url, served, engine, idle_requests))
        with Client(url, model=served) as client:
            stats = next(w.stats for w in client.workers() if w.pid == stack.info.pid)
    return summary, outputs, idle, stats


# ------------------------------------------------------------------------------ main


def print_table(results: dict[str, dict[str, Any]]) -> None:
    head = (f"{'path':<11} {'tok/s':>7} {'ratio':>6} | {'TTFT p50/p90/p99 ms':>22} | "
            f"{'TPOT p50/p90/p99 ms':>20} | {'ITL p50/p90/p99 ms':>20}")
    print(head)
    base = results["in-process"]["output_tok_s"]
    for name, r in results.items():
        def triple(key: str, r: dict[str, Any] = r) -> str:
            m = r[key]
            return f"{m['p50']:.0f}/{m['p90']:.0f}/{m['p99']:.0f}"
        print(f"{name:<11} {r['output_tok_s']:>7.1f} {r['output_tok_s'] / base:>6.2f} | "
              f"{triple('ttft_ms'):>22} | {triple('tpot_ms'):>20} | {triple('itl_ms'):>20}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--num-requests", type=int, default=None, help="default 64 (8 quick)")
    parser.add_argument("--idle-requests", type=int, default=None, help="default 60 (5 quick)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--out", default="benchmarks/results/serve.json")
    args = parser.parse_args(argv)
    args.num_requests = args.num_requests or (8 if args.quick else 64)
    args.idle_requests = args.idle_requests or (5 if args.quick else 60)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from kvrelay_worker.loading import load_model_source

    vocab = load_model_source(args.model).config.vocab_size
    prompt_len, output_len = ((16, 64), (8, 32)) if args.quick else ((32, 256), (32, 128))
    workload = make_workload(args.num_requests, args.seed, prompt_len, output_len, vocab)
    options = engine_options(workload, args)
    local, local_out, engine = run_in_process(args.model, workload, options)
    queued, queued_out, (local_idle, queued_idle, pickup), worker_stats = run_queue(
        args.model, workload, options, engine, args.idle_requests)
    results = {"in-process": local, "queue": queued}
    print_table(results)
    idle_local, idle_queue = percentiles(local_idle), percentiles(queued_idle)
    added = {k: (idle_queue[k] - idle_local[k]) * 1e3 for k in idle_local}
    ratio = queued["output_tok_s"] / local["output_tok_s"]
    same = sum(a == b for a, b in zip(local_out, queued_out, strict=True))
    print(f"throughput ratio queue/in-process: {ratio:.3f} (goal >= 0.9)")
    print(f"TTFT the queue adds on an idle machine: p50 {added['p50']:.2f} ms, "
          f"p90 {added['p90']:.2f} ms (goal <= 5 ms at p50); in-process p50 "
          f"{idle_local['p50'] * 1e3:.2f} ms, queue p50 {idle_queue['p50'] * 1e3:.2f} ms")
    pickup_ms = {k: v * 1e3 for k, v in percentiles(pickup).items()}
    print(f"enqueue to pickup by the worker (client subscribe + Celery publish + delivery): "
          f"p50 {pickup_ms['p50']:.2f} ms, p90 {pickup_ms['p90']:.2f} ms")
    print(f"identical greedy outputs: {same}/{len(local_out)}")
    report = {
        "workload": workload.describe(), "engine_options": options,
        "results": results, "throughput_ratio": ratio,
        "idle_ttft_ms": {"in-process": {k: v * 1e3 for k, v in idle_local.items()},
                         "queue": {k: v * 1e3 for k, v in idle_queue.items()},
                         "added": added, "enqueue_to_pickup": pickup_ms},
        "identical_outputs": same, "worker_stats": worker_stats,
    }
    write_result(args.out, "serve", args, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
