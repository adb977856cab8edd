"""The fault-injection harness on a fixed set of seeds: real Redis (a replicated primary
that refuses writes or restarts, or Sentinel with a primary kill), real Celery workers
killed, stopped, restarted and, through their proxies, blackholed, Redis slowed down, the
tiny model preempting under a small KV pool, and callers that cancel, disconnect and
resume, read slowly. Each seed must break no rule; a failure
prints the seed, what broke and the command that replays it.

A deliberately broken store (one entry deleted from a running job's log, from outside
the worker) must be caught: that shows the checker reads the store, not only what the
callers were shown.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from chaos.runner import RunResult, run_schedule
from chaos.schedule import DROP_LOG_ENTRY, PRESSURE, SENTINEL, SIMULATED, make_schedule

pytestmark = pytest.mark.integration

# One seed per scenario, each with a mix of faults (see ``make_schedule(seed).describe()``):
# 8: three workers, placement, a cancel racing the SIGKILL of its job's worker, MISCONF,
# one worker blackholed for 1.5 s, one stopped, the primary SIGKILLed and restarted from
# its append-only file;
# 9218: Sentinel, the primary killed (and brought back as a replica) and a worker killed
# half a second later, an orphaned caller, seeded sampled jobs (seed 5, the pub/sub
# connections killed 0.4 s before the primary, leaves an unacknowledged message about one
# run in two: docs/chaos.md, open findings);
# 20: the tiny model on two workers, their pool a quarter of their jobs' need, priorities
# (it preempts), Redis slowed by 140 ms per chunk while a worker is stopped, the pub/sub
# connections killed, a clock 2.4 s behind, seeded sampled and n = 2 jobs.
# (Cuts, replica lag and failbacks are left to the benchmark's random schedules: another
# seed or two would take the chaos tests past their 3 minutes.)
SEEDS = {SIMULATED: 8, SENTINEL: 9218, PRESSURE: 20}
# Worker faults only (a kill, a cancel racing a kill, a stop, a drain), so that the
# deleted log entry is the one thing wrong.
BROKEN_SEED = 214


def _explain(result: RunResult) -> str:
    return (f"{result.report()}\n{result.schedule.describe()}\n"
            f"seconds {result.seconds}, outcomes {result.outcomes}\n{result.worker_logs}")


@pytest.mark.parametrize("scenario", [SIMULATED, SENTINEL])
def test_a_seeded_schedule_breaks_no_rule(scenario: str, tmp_path: Path) -> None:
    seed = SEEDS[scenario]
    assert make_schedule(seed).scenario == scenario
    result = run_schedule(seed, tmp_path)
    assert not result.harness_errors, _explain(result)
    assert result.ok, _explain(result)


def test_preemption_under_kv_pressure_breaks_no_rule(
        tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    seed = SEEDS[PRESSURE]
    assert make_schedule(seed).scenario == PRESSURE
    result = run_schedule(seed, tmp_path, model_path=str(tiny_model("llama-mqa")))
    assert not result.harness_errors, _explain(result)
    assert result.ok, _explain(result)
    assert result.engine.get("preemptions", 0) > 0, f"no preemption: {_explain(result)}"


def test_a_lost_log_entry_is_caught(tmp_path: Path) -> None:
    result = run_schedule(BROKEN_SEED, tmp_path, broken=DROP_LOG_ENTRY)
    drops = [f for f in result.faults if f.plan.kind == DROP_LOG_ENTRY]
    assert len(drops) == 1, _explain(result)
    assert not drops[0].error, _explain(result)
    # "deleted entry <id> of job <job id>"
    tampered = result.job_index[drops[0].note.rsplit(" ", 1)[-1]]
    caught = [v for v in result.violations if v.rule == "log-seq" and v.job == tampered]
    assert caught, _explain(result)
    assert f"--replay {BROKEN_SEED} --broken {DROP_LOG_ENTRY}" in result.report()
