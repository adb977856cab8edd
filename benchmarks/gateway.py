"""Gateway overhead: the OpenAI-compatible HTTP door against the SDK alone, same run.

A real worker on a tiny random model (torch on one thread) serves both sides, so the
model costs little and what differs is the door:
- TTFT added: idle machine, one request at a time, alternating SDK and gateway
  (``httpx`` streaming, first SSE event), p50 of each and the difference;
- throughput: ``--concurrency`` streams at once, output tokens/s through each, the ratio;
- the gateway process's CPU time per streamed token (from its rusage, via psutil).

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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency_stats import flush_db, report

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


async def http_load(http: httpx.AsyncClient, url: str, model: str, n: int, tokens: int) -> int:
    async def one(i: int) -> int:
        body = {"model": model, "prompt": [5 + i % 300, 6, 7], "max_tokens": tokens,
                "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        last = ""
        async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    last = line
        count: int = json.loads(last[6:])["usage"]["completion_tokens"]
        return count

    return sum(await asyncio.gather(*(one(i) for i in range(n))))


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


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tiny_model import tiny_worker_stack

    with tempfile.TemporaryDirectory(prefix="kvrelay-gateway-bench-") as tmp, \
            tiny_worker_stack(args.redis, args.concurrency * 2, Path(tmp)) as stack:
        base = stack.start_gateway(args.port).removesuffix("/v1")
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert stack.gateway is not None
        return asyncio.run(measure(args, base, stack.plan.served_model, stack.gateway.pid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--port", type=int, default=18000)
    parser.add_argument("--requests", type=int, default=40, help="sequential TTFT samples")
    parser.add_argument("--ttft-tokens", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", default="benchmarks/results/gateway.json")
    args = parser.parse_args()
    flush_db(args.redis)
    result = run(args)
    report(result, args.out)


if __name__ == "__main__":
    main()
