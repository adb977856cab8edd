"""Redis cost per generated token: commands and server CPU, from one real worker.

A private redis-server and one real kvrelay worker process (a tiny random model: the
point is Redis, not the model) serve ``--streams`` concurrent SDK streams of
``--tokens`` tokens each. Around that run the benchmark reads Redis's own counters:

- ``INFO commandstats`` deltas: Redis commands per generated token, in all and per
  command (a Lua script's inner calls count as the commands they are; ``INFO`` itself,
  the benchmark's probe, is left out);
- ``INFO cpu`` deltas (``used_cpu_sys + used_cpu_user``): Redis CPU µs per token, split
  into user and system time, with each command's ``commandstats`` usec per token (a
  script's usec includes its inner calls, which are counted again under their own
  names), and what is left above the CPU Redis spends anyway while the worker idles
  (read over ``--idle-s`` seconds before the run: heartbeats, leases, Celery's polling);
- the streams' delivery gaps: the time between two consecutive chunks of one stream as
  the SDK hands them out (p50/p99), beside the worker's mean engine step (its heartbeat's
  step count over the run's wall time), since a delivery gap may not grow past one step
  plus 5 ms.

Everything the system sends through Redis is counted: the SDK's enqueue, subscribe and
log reads, Celery's broker traffic, leases, heartbeats and the event writes.

A/B against other code (e.g. main): check it out in a second worktree and put its three
package folders first on ``PYTHONPATH``; the worker process inherits it::

    git worktree add /tmp/kvrelay-main main
    PYTHONPATH=/tmp/kvrelay-main/client:/tmp/kvrelay-main/worker:/tmp/kvrelay-main/kernels \\
        .venv/bin/python benchmarks/redis_cost.py --label main
    .venv/bin/python benchmarks/redis_cost.py --label branch
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from harness import percentiles, print_report, tiny_worker_stack, write_result

from kvrelay import AsyncClient
from kvrelay.keys import Keyspace
from kvrelay.protocol import decode_worker_info

RESULTS = Path(__file__).resolve().parent / "results"
# The benchmark's own probes, not part of the system's cost.
_PROBES = ("info",)


@dataclass
class Counters:
    """Redis's own counters at one moment."""

    calls: dict[str, int]  # per command (``INFO commandstats``)
    usec: dict[str, int]  # µs spent executing each command
    cpu_user: float  # seconds (``INFO cpu``)
    cpu_sys: float
    at: float  # perf_counter when read

    @property
    def cpu(self) -> float:
        return self.cpu_user + self.cpu_sys


def redis_counters(client: redis.Redis) -> Counters:
    stats = client.info("commandstats")
    cpu = client.info("cpu")
    return Counters(
        calls={name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()},
        usec={name.removeprefix("cmdstat_"): int(v["usec"]) for name, v in stats.items()},
        cpu_user=float(cpu["used_cpu_user"]), cpu_sys=float(cpu["used_cpu_sys"]),
        at=time.perf_counter())


def engine_steps(client: redis.Redis, keys: Keyspace) -> int:
    """Engine steps so far, summed over the workers' heartbeats."""
    total = 0
    for worker_id in client.smembers(keys.workers):  # type: ignore[union-attr]
        raw = client.get(keys.worker_heartbeat(worker_id.decode()))
        if raw is not None:
            total += int(decode_worker_info(raw).stats.get("steps", 0))  # type: ignore[arg-type]
    return total


async def run_streams(url: str, model: str, streams: int, tokens: int,
                      limit_s: float) -> dict[str, Any]:
    """Open every stream at once; the gaps between each stream's chunks, tokens seen."""
    gaps: list[float] = []
    received = 0
    contiguous = True
    async with AsyncClient(url, model=model, stream_timeout=limit_s) as client:

        async def one(i: int) -> None:
            nonlocal received, contiguous
            last: float | None = None
            seqs: list[int] = []
            async with client.stream(prompt_token_ids=[7 + i % 400, 8, 9], max_tokens=tokens,
                                     temperature=0.0, ignore_eos=True) as stream:
                async for chunk in stream:
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
                    seqs.append(chunk.seq)
                    received += len(chunk.token_ids)
            contiguous = contiguous and seqs == list(range(seqs[0], seqs[0] + len(seqs)))

        await client.generate(prompt_token_ids=[5, 6], max_tokens=2)  # warm every path
        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(streams))), limit_s)
        elapsed = time.perf_counter() - start
    return {"gaps": gaps, "tokens": received, "elapsed": elapsed, "contiguous": contiguous}


async def measure(url: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    keys = Keyspace()
    try:
        # Warm up (scripts loaded, connections open), then start counting.
        await run_streams(url, model, 4, 4, args.timeout)
        # Redis's CPU while the worker idles (heartbeats, leases, Celery's polling):
        # the floor every second costs, whatever the tokens.
        idle0 = redis_counters(client)
        await asyncio.sleep(args.idle_s)
        idle1 = redis_counters(client)
        steps0 = engine_steps(client, keys)  # a heartbeat written while idle
        c0 = redis_counters(client)
        run = await run_streams(url, model, args.streams, args.tokens, args.timeout)
        c1 = redis_counters(client)
        # The heartbeat lags the run: wait for one that reports the last steps.
        await asyncio.sleep(args.heartbeat_wait)
        steps1 = engine_steps(client, keys)
    finally:
        client.close()
    tokens = run["tokens"]
    delta = {name: c1.calls[name] - c0.calls.get(name, 0) for name in c1.calls
             if name not in _PROBES and c1.calls[name] > c0.calls.get(name, 0)}
    idle_rate = (idle1.cpu - idle0.cpu) / (idle1.at - idle0.at)
    window = c1.at - c0.at
    per_token = {name: round(n / tokens, 3)
                 for name, n in sorted(delta.items(), key=lambda kv: -kv[1])}
    # A script's usec includes its inner commands' (counted again under their names).
    usec_per_token = {name: round((c1.usec[name] - c0.usec.get(name, 0)) / tokens, 2)
                      for name in per_token}
    gaps_ms = [g * 1000 for g in run["gaps"]]
    points = percentiles(gaps_ms, (50, 99))
    steps = max(0, steps1 - steps0)
    return {
        "label": args.label,
        "streams": args.streams,
        "tokens_per_stream": args.tokens,
        "generated_tokens": tokens,
        "all_seq_contiguous": run["contiguous"],
        "elapsed_s": round(run["elapsed"], 3),
        "output_tok_s": round(tokens / run["elapsed"], 1),
        "redis_commands_per_token": round(sum(delta.values()) / tokens, 3),
        "redis_cpu_us_per_token": round((c1.cpu - c0.cpu) / tokens * 1e6, 2),
        "  of_which_user_us": round((c1.cpu_user - c0.cpu_user) / tokens * 1e6, 2),
        "  of_which_sys_us": round((c1.cpu_sys - c0.cpu_sys) / tokens * 1e6, 2),
        "redis_idle_cpu_ms_per_s": round(idle_rate * 1000, 2),
        "redis_cpu_us_per_token_above_idle": round(
            (c1.cpu - c0.cpu - idle_rate * window) / tokens * 1e6, 2),
        "delivery_gap_p50_ms": round(points["p50"], 2),
        "delivery_gap_p99_ms": round(points["p99"], 2),
        "engine_steps": steps,
        "mean_engine_step_ms": round(run["elapsed"] / steps * 1000, 2) if steps else None,
        "tokens_per_published_event": round(tokens / max(1, delta.get("publish", 0)), 2),
        "commands_per_token_by_command": per_token,
        "command_usec_per_token_by_command": usec_per_token,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--heartbeat-wait", type=float, default=2.5,
                        help="seconds to wait for a heartbeat (one per lease refresh, 1 s)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the model, Redis and worker logs here (default: a temp dir)")
    parser.add_argument("--idle-s", type=float, default=3.0,
                        help="seconds of idle worker over which Redis's floor CPU is read")
    parser.add_argument("--label", default="branch", help="names this run in the JSON")
    parser.add_argument("--out", default=None,
                        help="JSON path (default: benchmarks/results/redis_cost-LABEL.json)")
    args = parser.parse_args()
    out = args.out or str(RESULTS / f"redis_cost-{args.label}.json")
    with tempfile.TemporaryDirectory(prefix="kvrelay-redis-cost-") as tmp, \
            tiny_worker_stack(None, args.streams, args.workdir or Path(tmp)) as stack:
        result = asyncio.run(measure(stack.url, stack.served_model, args))
    breakdown = result.pop("commands_per_token_by_command")
    usec = result.pop("command_usec_per_token_by_command")
    print_report({**result,
                  **{f"  {k} (calls, usec)": (v, usec[k]) for k, v in breakdown.items()}})
    write_result(out, "redis_cost", args, {**result, "commands_per_token_by_command": breakdown,
                                           "command_usec_per_token_by_command": usec})


if __name__ == "__main__":
    main()
