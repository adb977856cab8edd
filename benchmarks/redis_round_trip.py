"""What one round trip costs Redis on this machine, apart from the command it carries.

Redis's CPU per generated token (``scaling.py``) is mostly not its commands' own time:
every request costs a read, a reply, and often a wake-up from ``epoll_wait``, which on a
virtual machine costs far more than the command itself. This measures that floor against
a private ``redis-server``: a trivial command (``SET``), unpipelined, back to back and
paced (Redis idles between requests, as it does in a fleet), then 16 to a pipeline;
Redis's CPU per request from ``INFO cpu`` (less its idle rate, measured first: its own
timers), the time inside the command from ``INFO commandstats``, and its wake-ups
(voluntary context switches) per request.

    python benchmarks/redis_round_trip.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import redis
from harness import private_redis, write_result
from harness.redis_counters import process_counters, redis_counters


def _cpu_s(url: str) -> float:
    return redis_counters(url)["_cpu_s"]


def measure(url: str, pid: int, requests: int, interval_s: float, pipeline: int,
            idle_cpu_per_s: float) -> dict[str, float]:
    client = redis.Redis.from_url(url)
    client.config_resetstat()
    cpu_before, wakes_before = _cpu_s(url), process_counters(pid)["wakeups"]
    started = time.perf_counter()
    for _ in range(requests // pipeline):
        if pipeline == 1:
            client.set("k", "v")
        else:
            pipe = client.pipeline(transaction=False)
            for _ in range(pipeline):
                pipe.set("k", "v")
            pipe.execute()
        if interval_s:
            time.sleep(interval_s)
    elapsed = time.perf_counter() - started
    cpu = _cpu_s(url) - cpu_before - idle_cpu_per_s * elapsed
    wakes = process_counters(pid)["wakeups"] - wakes_before
    inside = float(client.info("commandstats")["cmdstat_set"]["usec_per_call"])
    client.close()
    return {"interval_ms": interval_s * 1000, "pipeline": pipeline,
            "requests_per_s": requests / elapsed,
            "redis_cpu_us_per_command": cpu * 1e6 / requests,
            "inside_command_us": inside, "wakeups_per_command": wakes / requests}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/redis_round_trip.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvrelay-round-trip-") as tmp:
        with private_redis(Path(tmp) / "redis") as server:
            url = server.url
            idle_before = _cpu_s(url)
            time.sleep(5.0)
            idle = (_cpu_s(url) - idle_before) / 5.0
            rows = [measure(url, server.process.pid, n, interval, pipeline, idle)
                    for n, interval, pipeline in ((20_000, 0.0, 1), (3_000, 0.001, 1),
                                                  (1_000, 0.005, 1), (64_000, 0.0, 16))]
    print(f"Redis idle: {idle * 1000:.1f} ms CPU per second (subtracted below)")
    print(f"{'pacing':>12} {'pipeline':>8} {'req/s':>8} {'CPU µs/cmd':>11} "
          f"{'inside µs':>10} {'wake-ups/cmd':>13}")
    for r in rows:
        pacing = f"{r['interval_ms']:.0f} ms" if r["interval_ms"] else "none"
        print(f"{pacing:>12} {r['pipeline']:>8} {r['requests_per_s']:>8.0f} "
              f"{r['redis_cpu_us_per_command']:>11.1f} {r['inside_command_us']:>10.2f} "
              f"{r['wakeups_per_command']:>13.2f}")
    write_result(args.out, "redis_round_trip", args,
                 {"idle_cpu_ms_per_s": idle * 1000, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
