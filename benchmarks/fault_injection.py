"""Randomized fault-injection runs: N seeded schedules against real Redis and real
workers, each checked (tests/chaos, docs/chaos.md), with a table and a JSON result.

    PYTHONPATH=tests python benchmarks/fault_injection.py [--schedules 200]
        [--seed 1] [--scenario simulated|sentinel|pressure] [--out FILE]
    PYTHONPATH=tests python benchmarks/fault_injection.py --replay SEED
        [--broken drop_log_entry]

(``tests`` on the path: the harness and its checker live in ``tests/chaos``, which the
CI test runs a few seeds of.)

Seeds run one after another (``--seed`` is the first); every failing seed prints its
violations and the line that replays it. The exit status is 1 when any seed failed.
"""

from __future__ import annotations

import argparse
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
        "harness_errors": result.harness_errors,
        "outcomes": result.outcomes, "engine": result.engine,
        "seconds": {k: round(v, 2) for k, v in result.seconds.items()},
    }


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'seed':>6} {'scenario':<10} {'w':>2} {'jobs':>4} {'viol':>5} {'secs':>6}  faults"]
    for row in rows:
        lines.append(f"{row['seed']:>6} {row['scenario']:<10} {row['workers']:>2} "
                     f"{row['jobs']:>4} {len(row['violations']):>5} "
                     f"{row['seconds'].get('total', 0):>6.1f}  {','.join(row['faults'])}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument("--replay", type=int, help="run this one seed, verbosely")
    parser.add_argument("--scenario", choices=SCENARIOS)
    parser.add_argument("--broken", choices=BROKEN_VARIANTS)
    parser.add_argument("--out", type=Path, default=RESULTS / "fault-injection.json")
    args = parser.parse_args()
    seeds = [args.replay] if args.replay is not None else \
        list(range(args.seed, args.seed + args.schedules))
    root = Path(tempfile.mkdtemp(prefix="kvrelay-chaos-"))
    model_path: str | None = None
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    for seed in seeds:
        workdir = root / str(seed)
        if args.scenario in (None, "pressure") and model_path is None:
            model_path = tiny_model_path(root)
        result = run_schedule(seed, workdir, model_path=model_path, broken=args.broken,
                              scenario=args.scenario)
        rows.append(_row(result))
        status = "ok" if result.ok else f"{len(result.violations)} VIOLATIONS"
        print(f"seed {seed}: {status} in {result.seconds.get('total', 0):.1f}s "
              f"({result.schedule.scenario}; logs in {workdir})", flush=True)
        if not result.ok or result.harness_errors or args.replay is not None:
            print(result.report(), flush=True)
        if args.replay is not None:
            print(result.schedule.describe())
    failed = [row["seed"] for row in rows if row["violations"]]
    print(_table(rows))
    print(f"{len(rows)} schedules, {len(failed)} with violations {failed[:20]}, "
          f"{time.monotonic() - started:.0f}s")
    write_result(args.out, "fault_injection", args, {
        "schedules": len(rows), "first_seed": seeds[0], "scenario": args.scenario,
        "broken": args.broken, "failed_seeds": failed,
        "seconds_per_schedule": round((time.monotonic() - started) / max(1, len(rows)), 2),
        "runs": rows,
    })
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
