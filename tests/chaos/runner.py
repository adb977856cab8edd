"""One schedule, start to end: plan from the seed, reference tokens, bring-up, load and
faults together, then the checks; everything torn down whatever happens.

``run_schedule`` returns a ``RunResult`` (never raises for a violation: the caller
decides); ``replay_command`` is the line that runs the same seed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.worker_process import redis_for

from chaos.checker import Violation, check_jobs
from chaos.cluster import ENGINE_COUNTERS, LOG_TTL_S, ChaosCluster, wait_until
from chaos.faults import FaultInjector, FaultRecord
from chaos.log_read import LogRead, longer, read_log
from chaos.reference import reference_tokens
from chaos.retention import retained_past_last_write
from chaos.schedule import LOAD_S, LOSE_ENQUEUE, PRESSURE, VICTIM, Schedule, make_schedule
from chaos.tap import WireTap
from chaos.workload import Workload
from kvrelay.keys import Keyspace
from kvrelay.protocol import Started

KEYS = Keyspace()
# Seconds the load may run past its planned length (faults, takeovers, slow readers).
DRAIN_S = 60.0
# How long jobs whose callers left get to write their terminal events.
END_WAIT_S = 15.0
# A small schedule's (one worker, no faults: a job that has not ended by then never will).
SMALL_END_WAIT_S = 5.0


@dataclass
class RunResult:
    schedule: Schedule
    violations: list[Violation] = field(default_factory=list)
    # Faults that could not be done or undone: the run proved less than its schedule
    # says, so the seed fails (a fault that never landed must not pass as survived).
    harness_errors: list[str] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    # Engine counters summed over the workers alive at the end (preemptions, ...).
    engine: dict[str, int] = field(default_factory=dict)
    # Job id -> the job's index in the schedule.
    job_index: dict[str, int] = field(default_factory=dict)
    worker_logs: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations and not self.harness_errors

    def report(self) -> str:
        lines = [f"chaos seed {self.schedule.seed}: {len(self.violations)} violations, "
                 f"{len(self.harness_errors)} harness errors "
                 f"({self.schedule.scenario}, broken={self.schedule.broken}); replay: "
                 f"{replay_command(self.schedule)}"]
        lines += [f"  {v}" for v in self.violations]
        lines += [f"  harness: {e}" for e in self.harness_errors]
        lines += [f"  fault {f.plan.kind} @{f.plan.at:.1f}s {f.ended - f.began:.1f}s: "
                  f"{f.note}{f.error}" for f in self.faults]
        return "\n".join(lines)


def replay_command(schedule: Schedule) -> str:
    flags = f" --broken {schedule.broken}" if schedule.broken else ""
    if schedule.small:
        flags += " --small"
    elif make_schedule(schedule.seed).scenario != schedule.scenario:
        flags += f" --scenario {schedule.scenario}"
    return (f"PYTHONPATH=tests python benchmarks/fault_injection.py "
            f"--replay {schedule.seed}{flags}")


def tiny_model_path(root: Path) -> str:
    """The tiny random model the pressure scenario serves, built under ``root``."""
    from helpers.tiny_models import build_tiny_model

    from kvrelay_worker.loading import prepare_model

    folder = root / "llama-mqa"
    if not (folder / "config.json").exists():
        build_tiny_model("llama-mqa", folder,
                         tokenizer_folder=prepare_model("smollm2-135m-instruct", progress=False))
    return str(folder)


def run_schedule(seed: int, workdir: Path | None = None, *, model_path: str | None = None,
                 broken: str | None = None, scenario: str | None = None,
                 small: bool = False) -> RunResult:
    schedule = make_schedule(seed, scenario=scenario, broken=broken, small=small)
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"chaos-{seed}-"))
    if schedule.scenario == PRESSURE:
        model_path = model_path or tiny_model_path(workdir)
    result = RunResult(schedule)
    began = time.monotonic()
    reference = reference_tokens(schedule, model_path)
    cluster = ChaosCluster(schedule, workdir, model_path)
    try:
        cluster.start()
        result.seconds["setup"] = time.monotonic() - began
        _run_loaded(cluster, schedule, reference, result)
    finally:
        result.worker_logs = cluster.worker_logs()
        cluster.close()
    result.seconds["total"] = time.monotonic() - began
    with contextlib.suppress(OSError):  # a report only
        (workdir / "report.txt").write_text(f"{result.report()}\n{schedule.describe()}\n")
    return result


def _run_loaded(cluster: ChaosCluster, schedule: Schedule, reference: dict[int, list[list[int]]],
                result: RunResult) -> None:
    tap = WireTap(cluster.url).start()
    workload = Workload(schedule, cluster.url)
    injector = FaultInjector(cluster, workload.running_jobs, workload)
    loaded = time.monotonic()
    t0 = time.time() + 0.2

    async def load() -> None:
        await asyncio.gather(workload.run(t0, bound_s=LOAD_S + DRAIN_S),
                             injector.run_all(schedule.faults, t0))

    try:
        with _sdk_broken(schedule.broken):
            asyncio.run(load())
        for slot in cluster.slots:
            slot.cont()
        result.seconds["load"] = time.monotonic() - loaded
        checked = time.monotonic()
        logs = _final_logs(cluster, {run.job_id: longer(tap.logs.get(run.job_id, LogRead()),
                                                        run.log)
                                     for run in workload.runs},
                           {run.job_id for run in workload.runs
                            if run.enqueued_at is not None},
                           SMALL_END_WAIT_S if schedule.small else END_WAIT_S)
        time.sleep(0.5)  # anything published late reaches the tap
    finally:
        tap.stop()
    result.faults = injector.records
    result.job_index = {run.job_id: run.plan.index for run in workload.runs}
    result.harness_errors = [f"{f.plan.kind}: {f.error}" for f in injector.records if f.error]
    result.violations = check_jobs(workload.runs, reference,
                                   {job_id: log.events for job_id, log in logs.items()},
                                   {run.job_id: tap.of(run.job_id) for run in workload.runs},
                                   injector.records,
                                   {job_id: log.writers for job_id, log in logs.items()},
                                   skew_s=max((abs(s) for s in schedule.clock_skew.values()),
                                              default=0.0),
                                   picked={job_id for job_id, log in logs.items() if log.picked},
                                   log_ttl_s=LOG_TTL_S)
    result.violations += [Violation(None, "tap-decode", f"a reply-channel message did not "
                                    f"decode: {line}") for line in tap.undecodable]
    _keep_handled(cluster, workload, tap, result, logs)
    for run in workload.runs:
        result.outcomes[run.outcome] = result.outcomes.get(run.outcome, 0) + 1
    for slot in cluster.slots:
        for name, value in slot.killed_counters.items():
            result.engine[name] = result.engine.get(name, 0) + value
        if slot.current.alive():
            with contextlib.suppress(Exception):  # counters only: a report, not a check
                stats = slot.current.stats()
                for name in ENGINE_COUNTERS:
                    result.engine[name] = result.engine.get(name, 0) + int(stats.get(name, 0))
        else:
            result.violations.append(Violation(None, "worker-exit", f"{slot.current.name} "
                                               f"exited on its own: {_last_lines(slot.current.tail())}"))
    time.sleep(LOG_TTL_S + 2.0)
    with cluster.admin() as client:
        left = retained_past_last_write(client, [run.job_id for run in workload.runs],
                                        [job.prompt for job in schedule.jobs], LOG_TTL_S)
    result.violations += [Violation(None, "retention", line) for line in left]
    result.seconds["check"] = time.monotonic() - checked


@contextlib.contextmanager
def _sdk_broken(broken: str | None) -> Iterator[None]:
    """The callers' side of a broken variant: ``lose_enqueue`` drops the SDK's first
    push of the victim job (nothing reaches Redis, the caller is told it was queued)."""
    if broken != LOSE_ENQUEUE:
        yield
        return
    import kvrelay.enqueue as enqueue

    publish = enqueue.publish_task
    lost: list[str] = []

    def lossy(app: Any, name: str, payload: dict[str, Any], **kwargs: Any) -> None:
        if VICTIM in json.dumps(payload) and not lost:
            lost.append(str(kwargs.get("task_id")))
            return
        publish(app, name, payload, **kwargs)

    enqueue.publish_task = lossy
    try:
        yield
    finally:
        enqueue.publish_task = publish


def _final_logs(cluster: ChaosCluster, seen: dict[str, LogRead], enqueued: set[str],
                wait_s: float = END_WAIT_S) -> dict[str, LogRead]:
    """Each job's log once it ended: as its caller's snapshot saw it, or, where that had
    no terminal event yet, read again until it has one (up to ``wait_s``). Every job
    that was enqueued is waited for, one with no log yet too: a job whose caller gave up
    before any worker took it still ends in its log (a worker drops it with
    ``queue_timeout`` or ``cancelled``), and one that never does was lost."""
    logs = dict(seen)

    def all_ended() -> bool:
        with redis_for(cluster.admin_url()) as client:
            for job_id in logs:
                if not logs[job_id].ended:
                    logs[job_id] = longer(read_log(client, job_id), logs[job_id])
        return all(log.ended or (not log.events and j not in enqueued)
                   for j, log in logs.items())

    wait_until(all_ended, wait_s, 0.2)
    return logs


def _keep_handled(cluster: ChaosCluster, workload: Workload, tap: WireTap,
                  result: RunResult, logs: dict[str, LogRead]) -> None:
    """Write, beside the workers' logs, which jobs each worker started (from the tapped
    ``Started`` events), each job's log as the checker read it (seq runs per writing
    run) and the run's report: a failure that does not replay can still be read from
    the run's folder."""
    # A worker names itself host:pid; its log file is named after its slot's process.
    log_files = {str(w.process.pid): f"{w.name}.log" for slot in cluster.slots
                 for w in slot.processes if w.process is not None}
    handled: dict[str, list[str]] = {}
    for run in workload.runs:
        for tapped in tap.of(run.job_id):
            if isinstance(tapped.event, Started):
                name = tapped.event.worker
                log_file = log_files.get(name.rsplit(":", 1)[-1])
                handled.setdefault(f"{name} ({log_file})" if log_file else name, []).append(
                    f"job {run.plan.index} {run.job_id} attempt {tapped.event.attempt} "
                    f"run {tapped.event.run} at {tapped.at:.3f}")
    with contextlib.suppress(OSError):  # a report only
        (cluster.workdir / "handled.json").write_text(json.dumps({
            "seed": result.schedule.seed, "workers": handled,
            "jobs": {run.job_id: {"index": run.plan.index, "outcome": run.outcome,
                                  "error": run.error[:300],
                                  "log": _log_summary(logs.get(run.job_id, LogRead())),
                                  "chunks": _seq_runs([c.seq for c in run.chunks])}
                     for run in workload.runs},
        }, indent=1))


def _seq_runs(seqs: list[int]) -> str:
    """``0-41,49``: consecutive seqs as ranges."""
    ranges: list[list[int]] = []
    for seq in seqs:
        if ranges and seq == ranges[-1][1] + 1:
            ranges[-1][1] = seq
        else:
            ranges.append([seq, seq])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def _log_summary(log: LogRead) -> list[str]:
    """A log's events as seq ranges, one line per writing run in turn, the ending's type
    on the last."""
    lines: list[tuple[str, list[int]]] = []
    for event, writer in zip(log.events, log.writers, strict=False):
        if not lines or lines[-1][0] != writer:
            lines.append((writer, []))
        lines[-1][1].append(event.seq)
    summary = [f"{_seq_runs(seqs)} by {writer or '-'}" for writer, seqs in lines]
    if log.ended:
        summary.append(type(log.events[-1]).__name__)
    return summary


def _last_lines(text: str, count: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-count:])
