"""Scaling curve: 1, 2, 4, ... simulated GPU workers on one Redis, and what Redis pays per token.

For each fleet size N: a private ``redis-server``, N real worker processes
(``celery -A kvrelay_worker.app worker``) running the simulated engine
(``KVRELAY_MODEL=simulated``: no weights, each step sleeps as a GPU would, see
``kvrelay_worker/simulated``), and load-generator processes (``scaling_load.py``) that
keep exactly N x concurrency SDK streams in flight, so every worker's batch stays full
while its queue holds no backlog (pickup time is then the dispatch path's, not queueing).
After a warm-up, one window is measured:

- generated tokens/s (token events received by the clients), and the share of the
  fleet's ideal rate (N x concurrency tokens per full-batch step);
- Redis commands per generated token and Redis CPU microseconds per generated token, from
  ``INFO commandstats`` and ``INFO cpu`` deltas over the window (the INFO calls excluded);
- enqueue-to-pickup time p50/p99 (each job's ``timings.queue``);
- inter-token delivery p50/p99 per stream, beside the engine's step time;
- CPU seconds per second of the workers, the load generators and Redis.

Slow motion: two CPU cores cannot run dozens of GPU-speed workers and their clients, so
the whole fleet runs ``--time-scale`` times slower: every step time *and* every periodic
upkeep of the worker (lease refresh and TTL, heartbeat, failover watchdog) is multiplied
by it. Commands per token are then those of full speed (per-token and per-job work is
unchanged, periodic work per token too); Redis CPU per token is measured at 1/scale of the
full-speed rate; latencies are reported in real (slowed) time, inter-token gaps also
divided by the scale.

    python benchmarks/scaling.py                      # sizes 1,2,4,8,16,32
    python benchmarks/scaling.py --sizes 1,2 --quick  # make bench's small run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import redis
from harness import percentiles, private_redis, write_result
from harness.redis_counters import cpu_seconds, process_counters, redis_counters

from kvrelay import Client

HERE = Path(__file__).resolve().parent
MODEL = "simulated"
# The worker's periodic upkeep at full speed (WorkerSettings' defaults), scaled with time.
_UPKEEP = {"lease_refresh": 1.0, "lease_ttl": 5.0, "watchdog_interval": 1.0}
# A fleet whose batches were at least this full measured what full speed would cost.
_FULL_OCCUPANCY = 0.9


# ----------------------------------------------------------------------------- processes


def pinned(cpus: set[int] | None) -> Any:
    """A ``preexec_fn`` that confines the child (and every thread it starts) to ``cpus``."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def cpu_split(args: argparse.Namespace) -> tuple[set[int] | None, set[int] | None]:
    """(Redis's CPUs, everyone else's) under ``--redis-cpu``; (None, None) without it."""
    if args.redis_cpu is None:
        return None, None
    everyone = set(os.sched_getaffinity(0))
    if args.redis_cpu not in everyone or len(everyone) < 2:
        raise SystemExit(f"--redis-cpu {args.redis_cpu}: needs another CPU of {everyone}")
    return {args.redis_cpu}, everyone - {args.redis_cpu}


def worker_env(url: str, args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "KVRELAY_REDIS_URL": url, "KVRELAY_MODEL": MODEL,
        "KVRELAY_CONCURRENCY": str(args.concurrency),
        "KVRELAY_SIMULATED_STEP_MS": str(args.step_ms * args.time_scale),
        "KVRELAY_SIMULATED_TOKEN_MS": str(args.token_ms * args.time_scale),
        "PYTHONUNBUFFERED": "1",
    })
    for name, seconds in _UPKEEP.items():
        env[f"KVRELAY_{name.upper()}"] = str(seconds * args.time_scale)
    return env


def start_workers(n: int, url: str, args: argparse.Namespace, workdir: Path,
                  cpus: set[int] | None = None) -> list[subprocess.Popen[bytes]]:
    env = worker_env(url, args)
    procs = []
    for i in range(n):
        log = (workdir / f"worker-{i}.log").open("wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "kvrelay_worker.app", "worker",
             "--pool", "threads", "--concurrency", str(args.concurrency),
             "--hostname", f"sim{i}@%h", "--loglevel", "WARNING", "--without-mingle",
             "--without-gossip"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=pinned(cpus)))
    return procs


def wait_workers(url: str, procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with Client(url, model=MODEL) as client:
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a worker exited while starting (see its log)")
            if len(client.workers()) >= len(procs):
                return
            time.sleep(0.2)
    raise TimeoutError(f"{len(procs)} workers not ready after {timeout}s")


def stop_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# -------------------------------------------------------------------------- measurement


def run_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"kvrelay-scaling-{n}-") as tmp, \
            contextlib.ExitStack() as servers:
        workdir = Path(tmp)
        redis_cpus, fleet_cpus = cpu_split(args)
        server = servers.enter_context(private_redis(workdir / "redis", redis_cpus))
        url, redis_pid = server.url, server.process.pid
        workers: list[subprocess.Popen[bytes]] = []
        loads: list[subprocess.Popen[bytes]] = []
        try:
            workers = start_workers(n, url, args, workdir, fleet_cpus)
            wait_workers(url, workers, timeout=60 + 5 * n)
            # What Redis spends with the fleet up and idle (Celery's polling, heartbeats,
            # its own cron): per second, whatever the tokens.
            time.sleep(2.0)
            idle_before, idle_at = redis_counters(url), time.time()
            time.sleep(args.idle)
            idle_rate = (redis_counters(url)["_cpu_s"] - idle_before["_cpu_s"]) / (
                time.time() - idle_at)
            streams = n * args.streams_per_worker
            procs = min(args.load_procs, streams)
            for i in range(procs):
                share = streams // procs + (1 if i < streams % procs else 0)
                config = {"redis_url": url, "model": MODEL, "streams": share,
                          "first_index": i * streams,
                          "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens}
                loads.append(subprocess.Popen(
                    [sys.executable, str(HERE / "scaling_load.py"), json.dumps(config)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=(workdir / f"load-{i}.log").open("wb"), preexec_fn=pinned(fleet_cpus)))
            time.sleep(args.warmup)
            groups = {"workers": [p.pid for p in workers], "load": [p.pid for p in loads],
                      "redis": [redis_pid]}
            if args.slowlog:
                slowlog_start(url)
            start, before = time.time(), redis_counters(url)
            syscalls_before = process_counters(redis_pid)
            cpu_before = {k: cpu_seconds(v) for k, v in groups.items()}
            machine_before = psutil.cpu_times()
            time.sleep(args.measure)
            end, after = time.time(), redis_counters(url)
            syscalls_after = process_counters(redis_pid)
            slow = slowlog_totals(url) if args.slowlog else None
            steps = engine_step_ms(url)
            cpu_after = {k: cpu_seconds(v) for k, v in groups.items()}
            machine_after = psutil.cpu_times()
            window = json.dumps({"start": start, "end": end}).encode() + b"\n"
            for proc in loads:
                assert proc.stdin is not None
                proc.stdin.write(window)
                proc.stdin.close()
            results = []
            for proc in loads:
                assert proc.stdout is not None
                out = proc.stdout.read()  # the generator prints once its streams are closed
                proc.wait(timeout=60)
                if proc.returncode != 0:
                    raise RuntimeError(f"a load generator failed (log in {workdir})")
                results.append(json.loads(out.decode().strip().splitlines()[-1]))
        finally:
            stop_all([*loads, *workers])
    elapsed = end - start
    row = summarize(n, args, elapsed, before, after, results,
                    {k: (cpu_after[k] - cpu_before[k]) / elapsed for k in groups},
                    _busy_share(machine_before, machine_after), idle_rate)
    if slow is not None:
        row["slowlog_usec_per_token"] = {k: v / max(row["tokens"], 1) for k, v in slow.items()}
    row["engine_step_ms"] = steps
    # What the CPU per token is made of beyond the commands: round trips and wake-ups.
    row["redis_process_per_token"] = {
        k: (syscalls_after[k] - syscalls_before[k]) / max(row["tokens"], 1)
        for k in syscalls_after}
    # Issue 14's latency goal: a token's gap no worse than one engine step plus 5 ms, here
    # as the streams' p99 gap against the workers' p99 step (both real, slowed time; the
    # excess is what delivery, the clients and the workers' own overhead add).
    row["itl_p99_beyond_step_p99_ms"] = row["itl_ms"]["p99"] - steps["p99"]
    return row


def engine_step_ms(url: str) -> dict[str, float]:
    """The workers' modeled step times over their latest steps (their heartbeats): the
    median of their p50s and the mean of their p99s, in ms of slowed time."""
    with Client(url, model=MODEL) as client:
        stats = [w.stats for w in client.workers()]
    p50s = sorted(float(s.get("simulated_step_ms_p50", 0.0)) for s in stats)
    p99s = [float(s.get("simulated_step_ms_p99", 0.0)) for s in stats]
    return {"p50": p50s[len(p50s) // 2] if p50s else 0.0,
            "p99": sum(p99s) / len(p99s) if p99s else 0.0}


def slowlog_start(url: str) -> None:
    """Have Redis log every command with its duration (``--slowlog``)."""
    client = redis.Redis.from_url(url)
    try:
        client.config_set("slowlog-max-len", 1_000_000)
        client.config_set("slowlog-log-slower-than", 0)
        client.slowlog_reset()
    finally:
        client.close()


def slowlog_totals(url: str) -> dict[str, float]:
    """µs per command since ``slowlog_start``; scripts told apart by SHA prefix and key
    count (which script and how many jobs)."""
    client = redis.Redis.from_url(url)
    try:
        client.config_set("slowlog-log-slower-than", 10_000)
        entries = client.slowlog_get(1_000_000)
    finally:
        client.close()
    names = script_names()
    totals: dict[str, float] = {}
    for entry in entries:
        words = entry["command"].split(b" ")
        name = words[0].decode().lower()
        if name in ("evalsha", "fcall") and len(words) > 2:
            called = words[1].decode()
            name = f"{name} {names.get(called, called[:8])}"
        totals[name] = totals.get(name, 0.0) + float(entry["duration"])
        calls = f"{name} calls"
        totals[calls] = totals.get(calls, 0.0) + 1.0
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def script_names() -> dict[str, str]:
    """Function name and SHA1 (``EVALSHA``, Redis 6.2) -> name of every kvrelay script."""
    from kvrelay.lua_library import LIBRARY

    names = {}
    for script in LIBRARY.scripts:
        names[LIBRARY.function(script)] = script.name
        names[LIBRARY.sha(script)] = script.name
    return names


def _busy_share(before: Any, after: Any) -> float:
    idle = (after.idle + getattr(after, "iowait", 0)) - (before.idle + getattr(before, "iowait", 0))
    total = sum(after) - sum(before)
    return 1.0 - idle / total if total > 0 else 0.0


def full_step_ms(args: argparse.Namespace) -> float:
    """A full-batch decode step at GPU speed (before the time scale)."""
    return args.step_ms + args.token_ms * args.concurrency


def summarize(n: int, args: argparse.Namespace, elapsed: float, before: dict[str, float],
              after: dict[str, float], loads: list[dict[str, Any]], cpu: dict[str, float],
              machine_busy: float, idle_cpu_rate: float) -> dict[str, Any]:
    tokens = sum(r["tokens"] for r in loads)
    calls = {k: after[k] - before.get(k, 0.0) for k in after if not k.startswith("_")}
    calls.pop("info", None)
    total_calls = sum(calls.values())
    per_token = max(tokens, 1)
    gaps = [g for r in loads for g in r["gaps_s"]]
    pickups = [q for r in loads for q in r["pickups_s"]]
    itl = {k: v * 1000 for k, v in percentiles(gaps or [0.0]).items()}
    # A stream gets one token per engine step: its typical gap is the step as it ran
    # (prompt chunks of new jobs make a step longer than a pure decode).
    step_s = itl["p50"] / 1000 or float("nan")
    # What full batches would give at that step time.
    ideal = n * args.concurrency / step_s
    return {
        "workers": n,
        "tokens": tokens,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
        "ideal_tokens_per_s": ideal,
        # Share of the fleet's batch slots that decoded: below 1 when freed slots wait for
        # their next job, or the clients cannot keep up.
        "occupancy": tokens / elapsed / ideal,
        "full_speed_tokens_per_s": tokens / elapsed * args.time_scale,
        "redis_commands_per_token": total_calls / per_token,
        "redis_cpu_us_per_token": (after["_cpu_s"] - before["_cpu_s"]) * 1e6 / per_token,
        # Less what the idle fleet costs Redis per second (slow motion spreads that over
        # a tenth of the tokens): what serving the tokens adds.
        "redis_idle_cpu_ms_per_s": idle_cpu_rate * 1000,
        "redis_cpu_us_per_token_above_idle": (
            after["_cpu_s"] - before["_cpu_s"] - idle_cpu_rate * elapsed) * 1e6 / per_token,
        "commands_per_token_by_name": {
            k: v / per_token for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v},
        "command_usec_per_token_by_name": {
            k.removeprefix("_usec:"): (after[k] - before.get(k, 0.0)) / per_token
            for k in sorted(after, key=lambda k: before.get(k, 0.0) - after[k])
            if k.startswith("_usec:") and after[k] > before.get(k, 0.0)},
        "pickup_ms": {k: v * 1000 for k, v in percentiles(pickups or [0.0]).items()},
        "itl_ms": itl,
        "full_batch_decode_step_ms": full_step_ms(args) * args.time_scale,
        # How much later than one engine step the p99 token arrives: delivery delays are
        # real time (Redis, clients, CPU), so this is not divided by the time scale.
        "itl_p99_beyond_step_ms": itl["p99"] - step_s * 1000,
        "jobs_finished_in_window": sum(r["jobs_in_window"] for r in loads),
        "client_errors": sum(r["errors"] for r in loads),
        "cpu_cores": cpu,
        "machine_cpu_busy": machine_busy,
    }


# ------------------------------------------------------------------------------- report


def print_row_header() -> None:
    print(f"{'workers':>7} {'tok/s':>8} {'occ':>5} {'cmd/tok':>8} {'µs/tok':>7} {'>idle':>6} "
          f"{'pickup p50/p99 ms':>18} {'ITL p50/p99 ms':>15} {'p99-step':>8} {'-step99':>7} "
          f"{'cores wrk/load/redis':>21} {'busy':>5}", flush=True)


def print_row(r: dict[str, Any]) -> None:
    cores = r["cpu_cores"]
    print(f"{r['workers']:>7} {r['tokens_per_s']:>8.0f} {r['occupancy']:>5.2f} "
          f"{r['redis_commands_per_token']:>8.2f} {r['redis_cpu_us_per_token']:>7.1f} "
          f"{r.get('redis_cpu_us_per_token_above_idle', float('nan')):>6.1f} "
          f"{r['pickup_ms']['p50']:>8.1f}/{r['pickup_ms']['p99']:<9.1f} "
          f"{r['itl_ms']['p50']:>6.0f}/{r['itl_ms']['p99']:<8.0f} "
          f"{r['itl_p99_beyond_step_ms']:>8.0f} "
          f"{r.get('itl_p99_beyond_step_p99_ms', float('nan')):>7.0f} "
          f"{cores['workers']:>7.2f}/{cores['load']:.2f}/{cores['redis']:.2f} "
          f"{r['machine_cpu_busy']:>5.0%}", flush=True)


def projection(rows: list[dict[str, Any]], args: argparse.Namespace,
               gpus: int = 1000) -> dict[str, float]:
    """One Redis under ``gpus`` GPU workers at full speed, from the per-token costs of the
    largest fleet that kept its batches full (occupancy >= 0.9): in a fleet starved of CPU
    the publishers fall behind and merge token events, which makes tokens look cheaper."""
    full = [r for r in rows if r["occupancy"] >= _FULL_OCCUPANCY]
    last = full[-1] if full else rows[-1]
    per_gpu = args.concurrency / (full_step_ms(args) / 1000)
    us = last["redis_cpu_us_per_token"]
    cmds = last["redis_commands_per_token"]
    return {
        "gpus": gpus, "tokens_per_s_per_gpu": per_gpu,
        "redis_commands_per_s": gpus * per_gpu * cmds,
        "redis_cores_needed": gpus * per_gpu * us / 1e6,
        # Redis runs commands on one thread: keep it under ~70% of a core.
        "gpus_per_redis_at_70pct_core": 0.7e6 / (per_gpu * us),
        "from_workers": last["workers"],
    }


def write_plot(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["workers"] for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    ax1.plot(sizes, [r["tokens_per_s"] for r in rows], "o-", label="measured")
    ax1.plot(sizes, [r["ideal_tokens_per_s"] for r in rows], "--", color="gray",
             label="full batches at the measured step time")
    ax1.set(xlabel="simulated workers", ylabel="generated tokens/s (slow motion)",
            title="throughput", xscale="log", yscale="log")
    ax1.legend()
    ax2.plot(sizes, [r["redis_commands_per_token"] for r in rows], "o-", color="C1")
    ax2.set(xlabel="simulated workers", ylabel="Redis commands / token", xscale="log",
            title="Redis cost per generated token")
    ax2.set_ylim(0, 1.25 * max(r["redis_commands_per_token"] for r in rows))
    ax2.set_ylabel("Redis commands / token", color="C1")
    twin = ax2.twinx()
    twin.plot(sizes, [r["redis_cpu_us_per_token"] for r in rows], "s--", color="C2")
    twin.set_ylabel("Redis CPU µs / token", color="C2")
    twin.set_ylim(0, 1.25 * max(r["redis_cpu_us_per_token"] for r in rows))
    for key, style in (("p50", "o-"), ("p99", "s--")):
        ax3.plot(sizes, [r["pickup_ms"][key] for r in rows], style,
                 label=f"enqueue→pickup {key}")
    ax3.set(xlabel="simulated workers", ylabel="ms", xscale="log", yscale="log",
            title="enqueue → pickup")
    ax3.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default=None, help="fleet sizes (default 1,2,4,8,16,32)")
    parser.add_argument("--concurrency", type=int, default=64,
                        help="jobs (batch) per worker")
    parser.add_argument("--step-ms", type=float, default=20.0,
                        help="fixed ms per step at GPU speed (KVRELAY_SIMULATED_STEP_MS)")
    parser.add_argument("--token-ms", type=float, default=0.08,
                        help="ms per batched token at GPU speed (KVRELAY_SIMULATED_TOKEN_MS)")
    parser.add_argument("--time-scale", type=float, default=10.0,
                        help="slow motion: step times and worker upkeep periods x this")
    parser.add_argument("--streams-per-worker", type=int, default=None,
                        help="streams kept in flight per worker (default: --concurrency)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64, help="mean output tokens")
    parser.add_argument("--load-procs", type=int, default=2, help="load generator processes")
    parser.add_argument("--warmup", type=float, default=None, help="seconds (default 15)")
    parser.add_argument("--idle", type=float, default=None,
                        help="seconds Redis's CPU is read with the fleet idle (default 10)")
    parser.add_argument("--measure", type=float, default=None, help="seconds (default 30)")
    parser.add_argument("--redis-cpu", type=int, default=None, metavar="CPU",
                        help="give redis-server this CPU to itself (the workers and load "
                             "generators get the others), as a Redis host would have")
    parser.add_argument("--slowlog", action="store_true",
                        help="also record Redis's SLOWLOG of the window: µs per token per "
                             "command and script (costs Redis some CPU)")
    parser.add_argument("--quick", action="store_true",
                        help="make bench's run: sizes 1,2,4, shorter windows")
    parser.add_argument("--out", default="benchmarks/results/scaling.json")
    parser.add_argument("--from-json", default=None, metavar="PATH",
                        help="no run: the table, projection and PNG of a stored JSON")
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in (args.sizes or ("1,2,4" if args.quick else
                                                  "1,2,4,8,16,32")).split(",")]
    args.streams_per_worker = args.streams_per_worker or args.concurrency
    args.warmup = args.warmup if args.warmup is not None else (8.0 if args.quick else 15.0)
    args.idle = args.idle if args.idle is not None else (3.0 if args.quick else 10.0)
    args.measure = args.measure if args.measure is not None else (10.0 if args.quick else 30.0)
    return args


def from_json(path: Path) -> int:
    """Print the table, the projection and the PNG of a stored run again (no run)."""
    stored = json.loads(path.read_text())
    args = argparse.Namespace(**(stored.get("config") or stored["args"]))
    rows = stored["results"]
    print_row_header()
    for row in rows:
        print_row(row)
    print_projection(projection(rows, args))
    write_plot(path.with_suffix(".png"), rows, _title(args))
    return 0


def _title(args: argparse.Namespace) -> str:
    return (f"simulated workers on one Redis ({args.concurrency} streams each, "
            f"{full_step_ms(args):.0f} ms steps, run {args.time_scale:g}x slower)")


def print_projection(proj: dict[str, float]) -> None:
    print(f"\nprojection from {proj['from_workers']} workers: 1,000 GPUs at "
          f"{proj['tokens_per_s_per_gpu']:.0f} tok/s each put "
          f"{proj['redis_commands_per_s'] / 1e6:.1f} M commands/s and "
          f"{proj['redis_cores_needed']:.0f} cores of Redis CPU on one Redis; one Redis core "
          f"(70% busy) serves about {proj['gpus_per_redis_at_70pct_core']:.0f} GPUs")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        return from_json(Path(args.from_json))
    step = full_step_ms(args)
    print(f"simulated step at batch {args.concurrency}: {step:.1f} ms at GPU speed "
          f"({args.step_ms:g} + {args.token_ms:g} x {args.concurrency}), run {args.time_scale:g}x "
          f"slower ({step * args.time_scale:.0f} ms); {args.prompt_tokens}-token prompts, "
          f"~{args.max_tokens} output tokens; {args.concurrency} streams per worker", flush=True)
    print_row_header()
    rows = []
    for n in args.sizes:
        rows.append(run_size(n, args))
        print_row(rows[-1])
    proj = projection(rows, args)
    print_projection(proj)
    out = Path(args.out)
    write_result(out, "scaling", args, {"full_step_ms": step, "results": rows,
                                        "projection": proj})
    png = out.with_suffix(".png")
    write_plot(png, rows, _title(args))
    print(f"wrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
