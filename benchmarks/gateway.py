"""Gateway overhead: the OpenAI-compatible HTTP door against the SDK alone, same run.

A real worker on a tiny random model (torch on one thread) serves both sides, so the
model costs little and what differs is the door:
- TTFT added: idle machine, one request at a time, alternating SDK and gateway
  (``httpx`` streaming, first SSE event), p50 of each and the difference;
- throughput: ``--concurrency`` streams at once, output tokens/s through each, the ratio;
- the gateway process's CPU time per streamed token (from its rusage, via psutil);
- throughput on the serving workload (``benchmarks/serve.py``'s: SmolLM2, 64 requests of
  32-256 prompt and 32-128 output tokens, all at once), after an uncounted warm-up pass SDK
  and gateway alternated twice, the mean of each and the ratio (``--serving-requests 0`` skips it).

    python benchmarks/gateway.py --redis redis://127.0.0.1:6379/15

The database named by ``--redis`` is emptied (FLUSHDB) first: give it a scratch one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from harness import flush_db, print_report, tiny_worker_stack, worker_stack, write_result
from harness.offline_systems import DEFAULT_MODEL, make_workload
from harness.offline_systems import serving_engine_options as engine_options

from kvrelay import AsyncClient


def p50_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 2)


async def sdk_ttft(client: AsyncClient, prompt: list[int], tokens: int) -> float:
    start = time.perf_counter()
    async with client.stream(prompt_token_ids=prompt, max_tokens=tokens, temperature=0.0,
                             ignore_eos=True) as stream:
        first = 0.0
        async for _ in stream:
            if not first:
                first = time.perf_counter() - start
    return first


async def http_ttft(http: httpx.AsyncClient, url: str, model: str, prompt: list[int],
                    tokens: int) -> float:
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    first = 0.0
    async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not first and line.startswith("data: "):
                first = time.perf_counter() - start
    return first


async def sdk_load(client: AsyncClient, n: int, tokens: int) -> int:
    async def one(i: int) -> int:
        done = await client.generate(prompt_token_ids=[5 + i % 300, 6, 7], max_tokens=tokens,
                                     temperature=0.0, ignore_eos=True)
        return len(done.token_ids)

    return sum(await asyncio.gather(*(one(i) for i in range(n))))


async def streamed_tokens(http: httpx.AsyncClient, url: str, model: str, prompt: list[int],
                          tokens: int) -> int:
    """One greedy streamed completion through the gateway; its output token count."""
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    last = ""
    async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                last = line
    count: int = json.loads(last[6:])["usage"]["completion_tokens"]
    return count


async def http_load(http: httpx.AsyncClient, url: str, model: str, n: int, tokens: int) -> int:
    return sum(await asyncio.gather(*(streamed_tokens(http, url, model, [5 + i % 300, 6, 7],
                                                      tokens) for i in range(n))))


async def measure(args: argparse.Namespace, url: str, model: str, gateway_pid: int
                  ) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=args.concurrency * 2)
    async with AsyncClient(args.redis, model=model, stream_timeout=300) as client, \
            httpx.AsyncClient(limits=limits, timeout=300) as http:
        for _ in range(3):  # warm both paths
            await sdk_ttft(client, [3, 4], 2)
            await http_ttft(http, url, model, [3, 4], 2)
        sdk, gw = [], []
        for i in range(args.requests):
            prompt = [10 + i, 11, 12]
            sdk.append(await sdk_ttft(client, prompt, args.ttft_tokens))
            gw.append(await http_ttft(http, url, model, prompt, args.ttft_tokens))
        throughput: dict[str, float] = {}
        cpu_per_token_us = 0.0
        for side in ("sdk", "gateway", "sdk ", "gateway "):  # twice each, interleaved
            gateway = psutil.Process(gateway_pid)
            cpu_before = sum(gateway.cpu_times()[:2])
            start = time.perf_counter()
            if side.strip() == "sdk":
                count = await sdk_load(client, args.concurrency, args.tokens)
            else:
                count = await http_load(http, url, model, args.concurrency, args.tokens)
            elapsed = time.perf_counter() - start
            rate = count / elapsed
            throughput[side.strip()] = max(throughput.get(side.strip(), 0.0), rate)
            if side.strip() == "gateway":
                cpu = sum(gateway.cpu_times()[:2]) - cpu_before
                cpu_per_token_us = round(cpu / count * 1e6, 1)
    return {
        "requests": args.requests,
        "ttft_sdk_p50_ms": p50_ms(sdk),
        "ttft_gateway_p50_ms": p50_ms(gw),
        "ttft_added_p50_ms": round(p50_ms(gw) - p50_ms(sdk), 2),
        "concurrency": args.concurrency,
        "tokens_per_request": args.tokens,
        "sdk_output_tok_s": round(throughput["sdk"], 1),
        "gateway_output_tok_s": round(throughput["gateway"], 1),
        "throughput_ratio": round(throughput["gateway"] / throughput["sdk"], 3),
        "gateway_cpu_per_streamed_token_us": cpu_per_token_us,
    }


async def serving_side(side: str, url: str, base: str, model: str, workload: Any
                       ) -> float:
    """Output tokens/s of the whole workload at once, through the SDK or the gateway."""
    limits = httpx.Limits(max_connections=len(workload.prompts) * 2)
    async with AsyncClient(url, model=model, stream_timeout=300) as client, \
            httpx.AsyncClient(limits=limits, timeout=300) as http:
        await sdk_ttft(client, [3, 4], 2)
        await http_ttft(http, base, model, [3, 4], 2)

        async def by_sdk(i: int) -> int:
            done = await client.generate(prompt_token_ids=workload.prompts[i],
                                         max_tokens=workload.output_lens[i], temperature=0.0,
                                         ignore_eos=True)
            return len(done.token_ids)

        async def by_gateway(i: int) -> int:
            return await streamed_tokens(http, base, model, workload.prompts[i],
                                         workload.output_lens[i])

        one = by_sdk if side == "sdk" else by_gateway
        start = time.perf_counter()
        count = sum(await asyncio.gather(*(one(i) for i in range(len(workload.prompts)))))
        return count / (time.perf_counter() - start)


def serving(args: argparse.Namespace) -> dict[str, Any]:
    """SDK against gateway on serve.py's workload, one worker serving SmolLM2."""
    from kvrelay_worker.loading import load_model_source

    vocab = load_model_source(DEFAULT_MODEL).config.vocab_size
    workload = make_workload(args.serving_requests, 0, (32, 256), (32, 128), vocab)
    options = engine_options(workload, argparse.Namespace(max_num_batched_tokens=512))
    settings = {"model": DEFAULT_MODEL, "device": "cpu", "dtype": "float32",
                "concurrency": len(workload.prompts), "redis_url": args.redis, **options}
    rates: dict[str, list[float]] = {"sdk": [], "gateway": []}
    with tempfile.TemporaryDirectory(prefix="kvrelay-gateway-serving-") as tmp, \
            worker_stack(settings, Path(tmp) / "stack", args.redis) as stack:
        base = stack.start_gateway(args.port + 1).removesuffix("/v1")
        wait_healthy(base)
        # A first, uncounted pass: the worker's first full batch runs slower (memory
        # first touched, allocator growth), which would favour whichever side ran second.
        for side in ("warm-up", "sdk", "gateway", "gateway", "sdk"):
            rate = asyncio.run(serving_side(side, args.redis, base, stack.served_model,
                                            workload))
            print(f"serving workload, {side}: {rate:.1f} output tok/s", file=sys.stderr)
            if side in rates:
                rates[side].append(rate)
    sdk, gateway = statistics.fmean(rates["sdk"]), statistics.fmean(rates["gateway"])
    return {"serving_requests": len(workload.prompts),
            "serving_sdk_output_tok_s": [round(r, 1) for r in rates["sdk"]],
            "serving_gateway_output_tok_s": [round(r, 1) for r in rates["gateway"]],
            "serving_throughput_ratio": round(gateway / sdk, 3)}


def wait_healthy(base: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{base}/health", timeout=1).raise_for_status()
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvrelay-gateway-bench-") as tmp, \
            tiny_worker_stack(args.redis, args.concurrency * 2, Path(tmp)) as stack:
        base = stack.start_gateway(args.port).removesuffix("/v1")
        wait_healthy(base)
        return asyncio.run(measure(args, base, stack.served_model, stack.gateway_pid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--port", type=int, default=18000)
    parser.add_argument("--requests", type=int, default=40, help="sequential TTFT samples")
    parser.add_argument("--ttft-tokens", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--serving-requests", type=int, default=64,
                        help="requests of the serving-workload phase (0: skip it)")
    parser.add_argument("--out", default="benchmarks/results/gateway.json")
    args = parser.parse_args()
    flush_db(args.redis)
    result = run(args)
    if args.serving_requests:
        flush_db(args.redis)
        result.update(serving(args))
    print_report(result)
    write_result(args.out, "gateway", args, result)


if __name__ == "__main__":
    main()
