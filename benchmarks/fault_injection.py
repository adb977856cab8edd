"""Randomized fault-injection runs: N seeded schedules against real Redis and real
workers, each checked (tests/chaos, docs/chaos.md), with a table and a JSON result.

    PYTHONPATH=tests python benchmarks/fault_injection.py [--schedules 200]
        [--seed 1] [--scenario simulated|sentinel|pressure] [--out FILE]
    PYTHONPATH=tests python benchmarks/fault_injection.py --replay SEED
        [--broken VARIANT [--small]] [--reruns 3] [--sdk-debug]

(``tests`` on the path: the harness and its checker live in ``tests/chaos``, which the
CI test runs a few seeds of.)

Seeds run one after another (``--seed`` is the first); every failing seed prints its
violations and the line that replays it, and is run again ``--reruns`` times (3) to say
how often it fails (a failure that does not replay is still a failure: its run's folder
keeps each worker's log, ``handled.json`` with the jobs each worker started, and
``report.txt``). A seed fails on a violation or a harness error (a fault not applied or
not healed). The exit status is 1 when any seed failed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chaos.runner import RunResult, run_schedule, tiny_model_path
from chaos.schedule import BROKEN_VARIANTS, SCENARIOS
from harness import write_result

RESULTS = Path(__file__).parent / "results"


def _row(result: RunResult) -> dict[str, Any]:
    schedule = result.schedule
    return {
        "seed": schedule.seed, "scenario": schedule.scenario, "broken": schedule.broken,
        "workers": schedule.workers, "jobs": len(schedule.jobs),
        "faults": [f.plan.kind for f in result.faults],
        "violations": [str(v) for v in result.violations],
        "harness_errors": result.harness_errors, "ok": result.ok,
        "outcomes": result.outcomes, "engine": result.engine,
        "seconds": {k: round(v, 2) for k, v in result.seconds.items()},
    }


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'seed':>6} {'scenario':<10} {'w':>2} {'jobs':>4} {'viol':>5} {'herr':>4} "
             f"{'failed':>6} {'secs':>6}  faults"]
    for row in rows:
        lines.append(f"{row['seed']:>6} {row['scenario']:<10} {row['workers']:>2} "
                     f"{row['jobs']:>4} {len(row['violations']):>5} "
                     f"{len(row['harness_errors']):>4} {row.get('failed_runs', '-'):>6} "
                     f"{row['seconds'].get('total', 0):>6.1f}  {','.join(row['faults'])}")
    return "\n".join(lines)


def _print_run(seed: int, result: RunResult, workdir: Path, *, verbose: bool) -> None:
    status = "ok" if result.ok else (f"{len(result.violations)} VIOLATIONS, "
                                     f"{len(result.harness_errors)} HARNESS ERRORS")
    print(f"seed {seed}: {status} in {result.seconds.get('total', 0):.1f}s "
          f"({result.schedule.scenario}; logs in {workdir})", flush=True)
    if not result.ok or verbose:
        print(result.report(), flush=True)
    if verbose:
        print(result.schedule.describe())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument("--replay", type=int, help="run this one seed, verbosely")
    parser.add_argument("--seeds", help="these seeds (comma-separated) instead of a range")
    parser.add_argument("--scenario", choices=SCENARIOS)
    parser.add_argument("--broken", choices=BROKEN_VARIANTS)
    parser.add_argument("--small", action="store_true",
                        help="with --broken: the smallest schedule showing the defect")
    parser.add_argument("--reruns", type=int, default=3,
                        help="runs of each failing seed again, to say how often it fails")
    parser.add_argument("--out", type=Path, default=RESULTS / "fault-injection.json")
    parser.add_argument("--sdk-debug", action="store_true",
                        help="log the callers' stream reads (kvrelay.stream at DEBUG)")
    args = parser.parse_args()
    # The callers' SDK logs to this process's stderr: timestamped, to be read beside the
    # workers' logs.
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.sdk_debug:
        logging.getLogger("kvrelay.stream").setLevel(logging.DEBUG)
    seeds = [args.replay] if args.replay is not None else \
        [int(seed) for seed in args.seeds.split(",")] if args.seeds else \
        list(range(args.seed, args.seed + args.schedules))
    root = Path(tempfile.mkdtemp(prefix="kvrelay-chaos-"))
    model_path: str | None = None
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    for seed in seeds:
        workdir = root / str(seed)
        if not args.small and args.scenario in (None, "pressure") and model_path is None:
            model_path = tiny_model_path(root)
        result = run_schedule(seed, workdir, model_path=model_path, broken=args.broken,
                              scenario=args.scenario, small=args.small)
        row = _row(result)
        rows.append(row)
        _print_run(seed, result, workdir, verbose=args.replay is not None)
        if not result.ok and args.reruns > 0:
            row["reruns"] = []
            for attempt in range(1, args.reruns + 1):
                again = root / f"{seed}-rerun{attempt}"
                rerun = run_schedule(seed, again, model_path=model_path, broken=args.broken,
                                     scenario=args.scenario, small=args.small)
                row["reruns"].append(_row(rerun) | {"folder": str(again)})
                _print_run(seed, rerun, again, verbose=False)
            fails = 1 + sum(not r["ok"] for r in row["reruns"])
            row["failed_runs"] = f"{fails}/{1 + args.reruns}"
            print(f"seed {seed}: failed {fails} of {1 + args.reruns} runs", flush=True)
    failed = [row["seed"] for row in rows if not row["ok"]]
    print(_table(rows))
    print(f"{len(rows)} schedules, {len(failed)} failed "
          f"{[(r['seed'], r.get('failed_runs')) for r in rows if not r['ok']][:20]}, "
          f"{time.monotonic() - started:.0f}s; runs kept under {root}")
    write_result(args.out, "fault_injection", args, {
        "schedules": len(rows), "first_seed": seeds[0], "scenario": args.scenario,
        "broken": args.broken, "failed_seeds": failed,
        "failed_runs": {r["seed"]: r.get("failed_runs") for r in rows if not r["ok"]},
        "seconds_per_schedule": round((time.monotonic() - started) / max(1, len(rows)), 2),
        "runs": rows,
    })
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
