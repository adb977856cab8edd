"""What the replica WAIT of sentinel mode costs the worker's event writes.

In sentinel mode (``redis+sentinel://``) every job-store round trip ends with
``WAIT 1 <timeout>`` so a failover cannot lose what it wrote (docs/sentinel.md). This
measures that cost where it is paid: the worker's ``JobStore.append_events``, one
pipelined round trip per engine step carrying one token event for each running job,
against a real primary with one real replica on this machine.

Two job stores share one client connected to the primary; they differ only in the URL
their settings carry (plain: no WAIT; sentinel: WAIT 1 200 ms), so the same Redis, the
same scripts and the same batches are timed, in interleaved rounds (median round counts).

    python benchmarks/sentinel_wait.py [--jobs 48] [--steps 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from harness import private_redis, write_result

from kvrelay.protocol import Tokens
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.settings import WorkerSettings

RESULTS = Path(__file__).parent / "results"
MODES = {
    "plain": "redis://127.0.0.1:1/0",  # never dialled: the store gets its client below
    "sentinel (WAIT 1)": "redis+sentinel://127.0.0.1:1/bench/0",
}


def _store(client: redis.Redis, url: str) -> JobStore:
    settings = WorkerSettings.from_env({"KVRELAY_REDIS_URL": url,
                                        "KVRELAY_MODEL": "bench-model"})
    return JobStore(client, settings)


def _one_round(store: JobStore, jobs: int, steps: int) -> list[float]:
    """Claim ``jobs`` jobs, then ``steps`` batches of one event per job; seconds per batch."""
    ids = [uuid.uuid4().hex for _ in range(jobs)]
    for job_id in ids:
        assert store.claim(job_id, "{}", "digest").status == "claimed"
    times = []
    for step in range(1, steps + 1):
        batch = [(job_id, Tokens(seq=step, token_ids=[step], text="x")) for job_id in ids]
        started = time.perf_counter()
        results = store.append_events(batch, fenced=True)
        times.append(time.perf_counter() - started)
        assert all(r == step for r in results), results[:3]
    for job_id in ids:
        store.release_done(job_id)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=48)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "sentinel_wait.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        with private_redis(Path(folder) / "primary") as primary, \
                private_redis(Path(folder) / "replica",
                              extra_args=("--replicaof", "127.0.0.1", str(primary.port))
                              ) as replica:
            with redis.Redis(port=replica.port) as probe:
                while probe.info("replication")["master_link_status"] != "up":
                    time.sleep(0.05)
            client = redis.Redis(port=primary.port)
            stores = {mode: _store(client, url) for mode, url in MODES.items()}
            per_round: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
            for _ in range(args.rounds):
                for mode, store in stores.items():
                    times = sorted(_one_round(store, args.jobs, args.steps))
                    total = sum(times)
                    per_round[mode].append({
                        "batch_p50_ms": 1000 * times[len(times) // 2],
                        "batch_p99_ms": 1000 * times[min(len(times) - 1,
                                                         int(len(times) * 0.99))],
                        "events_per_s": args.jobs * args.steps / total,
                    })
            client.close()
    summary: dict[str, Any] = {"jobs": args.jobs, "steps": args.steps, "rounds": args.rounds,
                               "modes": {}}
    for mode, rounds in per_round.items():
        summary["modes"][mode] = {key: statistics.median(r[key] for r in rounds)
                                  for key in rounds[0]}
    base = summary["modes"]["plain"]
    print(f"{args.jobs} jobs x {args.steps} steps, one event per job per batch, median of "
          f"{args.rounds} interleaved rounds")
    print(f"{'mode':<20}{'batch p50 ms':>14}{'batch p99 ms':>14}{'events/s':>12}{'vs plain':>10}")
    for mode, figures in summary["modes"].items():
        ratio = figures["events_per_s"] / base["events_per_s"]
        figures["throughput_vs_plain"] = ratio
        print(f"{mode:<20}{figures['batch_p50_ms']:>14.3f}{figures['batch_p99_ms']:>14.3f}"
              f"{figures['events_per_s']:>12.0f}{ratio:>9.2f}x")
    write_result(args.out, "sentinel_wait", args, summary)


if __name__ == "__main__":
    main()
