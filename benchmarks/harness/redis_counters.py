"""What Redis and the processes around it spend: command calls and CPU from ``INFO``,
system calls and wake-ups from ``/proc``, CPU seconds of process groups."""

from __future__ import annotations

from collections.abc import Sequence

import psutil
import redis


def redis_counters(url: str) -> dict[str, float]:
    """Calls per command, and Redis's CPU seconds (user + system, all threads)."""
    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
        cpu = client.info("cpu")
    finally:
        client.close()
    counters = {name.removeprefix("cmdstat_"): float(v["calls"]) for name, v in stats.items()}
    # µs inside each command (a script's includes its inner commands'), under "_usec:".
    counters.update({"_usec:" + name.removeprefix("cmdstat_"): float(v["usec"])
                     for name, v in stats.items()})
    counters["_cpu_s"] = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    return counters


def process_counters(pid: int) -> dict[str, float]:
    """Redis's system calls that read and write (``/proc/PID/io``) and its voluntary
    context switches (each is one sleep in ``epoll_wait``, so one wake-up): on a virtual
    machine a round trip or a wake-up costs far more than the command it carries."""
    proc = psutil.Process(pid)
    io = proc.io_counters()
    switches = proc.num_ctx_switches()
    return {"read_calls": float(io.read_count), "write_calls": float(io.write_count),
            "wakeups": float(switches.voluntary)}


def cpu_seconds(procs: Sequence[int]) -> float:
    total = 0.0
    for pid in procs:
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total
