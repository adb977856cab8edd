"""One seed, one schedule: which cluster, which jobs (and how their callers behave) and
which faults at which times. Everything random in a run is drawn here, so a seed replays
the same plan (the processes' own timing still varies, as it does in production).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Scenarios: the engine the workers run and the Redis they share.
SIMULATED = "simulated"  # the simulated engine on a primary with a replica
SENTINEL = "sentinel"  # the simulated engine behind Sentinel (the primary may be killed)
PRESSURE = "pressure"  # the tiny random model in a small KV pool, with priorities
SCENARIOS = (SIMULATED, SENTINEL, PRESSURE)
_SCENARIO_WEIGHTS = (0.6, 0.25, 0.15)

# Caller behaviours.
GENERATE = "generate"  # await generate()
STREAM = "stream"  # iterate the stream
SLOW = "slow"  # iterate, sleeping between chunks
RESUME = "resume"  # iterate, drop the stream after some chunks, resume(seq) later
CANCEL = "cancel"  # iterate, cancel() after some chunks, read to the end
BEHAVIOURS = (GENERATE, STREAM, SLOW, RESUME, CANCEL)
_BEHAVIOUR_WEIGHTS = (0.2, 0.3, 0.15, 0.2, 0.15)
# Drawn apart (``chaos.extras``): a caller in a child process SIGKILLed after some chunks,
# and a caller that cancels as the worker running its job is SIGKILLed (``CANCEL_RACE``).
ORPHAN = "orphan"
RACE = "race"

# Faults.
WORKER_KILL = "worker_kill"  # SIGKILL, restarted (a new process) after ``duration``
WORKER_STOP = "worker_stop"  # SIGSTOP for ``duration``, then SIGCONT
NOREPLICAS = "noreplicas"  # the replica SIGSTOPped: the primary refuses writes
MISCONF = "misconf"  # the primary's snapshot fails: it refuses writes
PAUSE_WRITES = "pause_writes"  # CLIENT PAUSE WRITE
PRIMARY_KILL = "primary_kill"  # SIGKILL of the Sentinel primary (a failover follows), brought back
# A second failover once the first settled: the primary killed again, so the first one
# (brought back as a replica) is promoted again. Drawn only after a ``PRIMARY_KILL``.
FAILBACK = "failback"
REPLICA_LAG = "replica_lag"  # the Sentinel replica paused in short bursts: WAITs come back short
REDIS_RESTART = "redis_restart"  # the primary SIGKILLed, restarted from its AOF after ``duration``
# Through each worker's proxy (``chaos.proxy``): the worker's engine keeps computing.
WORKER_CUT = "worker_cut"  # its connections reset, new ones refused
WORKER_BLACKHOLE = "worker_blackhole"  # its connections open, nothing passes: calls time out
REDIS_LATENCY = "redis_latency"  # every chunk to or from Redis waits ``magnitude`` s (all workers)
PUBSUB_KILL = "pubsub_kill"  # CLIENT KILL TYPE pubsub on the primary (every subscriber)
CANCEL_RACE = "cancel_race"  # SIGKILL of the worker running job ``target`` as it is cancelled
WORKER_DRAIN = "worker_drain"  # SIGTERM (drain, hand back), restarted after ``duration``
REDIS_FAULTS = frozenset({NOREPLICAS, MISCONF, PAUSE_WRITES, PRIMARY_KILL, FAILBACK, REPLICA_LAG,
                          REDIS_RESTART, REDIS_LATENCY, PUBSUB_KILL})
# Faults done by ``chaos.process_faults``.
PROCESS_FAULTS = frozenset({CANCEL_RACE, WORKER_DRAIN})
# Deliberate defects that the checker must catch, each wrong for one victim job (the one
# whose prompt holds ``VICTIM``). The first is done from outside the worker, the next
# inside the real worker process (``helpers/injected/sitecustomize.py``), the last in the
# callers' SDK (the test process).
DROP_LOG_ENTRY = "drop_log_entry"  # one entry deleted from a running job's log
DUPLICATE_TOKEN = "duplicate_token"  # one token sent twice (a takeover resumed early)
AFTER_TERMINAL = "after_terminal"  # an event published after the job's terminal one
IGNORE_CANCEL = "ignore_cancel"  # the worker drops the job's cancel and runs on
LEAK_MESSAGE = "leak_message"  # a copy of its message (base64 body) left in Redis
SKIP_TERMINAL = "skip_terminal"  # the terminal event never sent; the job hangs
LOSE_ENQUEUE = "lose_enqueue"  # the SDK's push of the job silently dropped
WRITE_AFTER_FENCE = "write_after_fence"  # a fenced run appends after its successor
WORKER_VARIANTS = frozenset({DUPLICATE_TOKEN, AFTER_TERMINAL, IGNORE_CANCEL, LEAK_MESSAGE,
                             SKIP_TERMINAL, WRITE_AFTER_FENCE})
BROKEN_VARIANTS = (DROP_LOG_ENTRY, DUPLICATE_TOKEN, AFTER_TERMINAL, IGNORE_CANCEL,
                   LEAK_MESSAGE, SKIP_TERMINAL, LOSE_ENQUEUE, WRITE_AFTER_FENCE)
VICTIM = "chaos victim"

# Seconds of load: jobs start within the first part, faults land anywhere in it.
LOAD_S = 6.0


@dataclass(frozen=True)
class JobPlan:
    index: int
    start_at: float
    prompt: str
    max_tokens: int
    priority: int = 0
    n: int = 1
    behaviour: str = STREAM
    # RESUME / CANCEL: after this many chunks; SLOW: every chunk.
    at_chunk: int = 0
    # RESUME: seconds away before resuming; SLOW: seconds per chunk.
    pause_s: float = 0.0
    # A short queue-wait limit (seconds): the job may expire in the queue; None: default.
    queue_timeout: float | None = None
    # Sampling: 0 is greedy; above it, always with a seed (the reference is then exact).
    temperature: float = 0.0
    seed: int | None = None
    best_of: int | None = None


@dataclass(frozen=True)
class FaultPlan:
    at: float
    kind: str
    duration: float
    target: int = 0  # the worker slot, for worker faults
    # REDIS_LATENCY: seconds per chunk; REPLICA_LAG: seconds per pause of the replica.
    magnitude: float = 0.0


@dataclass(frozen=True)
class Schedule:
    seed: int
    scenario: str
    workers: int
    concurrency: int
    jobs: tuple[JobPlan, ...]
    faults: tuple[FaultPlan, ...]
    worker_settings: dict[str, object] = field(default_factory=dict)
    broken: str | None = None
    # ``small_schedule``: the smallest schedule showing ``broken``, not the seed's own.
    small: bool = False
    # Seconds each worker slot's wall clock is off by (slot -> skew; others are true).
    clock_skew: dict[int, float] = field(default_factory=dict)
    # The callers' SDK places jobs by prompt prefix (workers' own queues).
    placement: bool = False

    @property
    def model(self) -> str:
        return "llama-mqa" if self.scenario == PRESSURE else "simulated"

    def describe(self) -> str:
        """One line per job and fault: what a failure report shows next to the seed."""
        lines = [f"seed {self.seed}: {self.scenario}, {self.workers} workers x "
                 f"{self.concurrency}, broken={self.broken}{' (small)' * self.small}, "
                 f"clock skew {self.clock_skew}, placement={self.placement}"]
        lines += [f"  job {j.index} @{j.start_at:.2f}s {j.behaviour} max_tokens={j.max_tokens}"
                  f" n={j.n} prio={j.priority} at_chunk={j.at_chunk} pause={j.pause_s:.2f}"
                  f" queue_timeout={j.queue_timeout} temperature={j.temperature}"
                  f" seed={j.seed} best_of={j.best_of}" for j in self.jobs]
        lines += [f"  fault @{f.at:.2f}s {f.kind} for {f.duration:.2f}s (worker {f.target})"
                  + (f" magnitude {f.magnitude:.3f}" if f.magnitude else "") for f in self.faults]
        return "\n".join(lines)


def _victim(index: int, broken: str) -> JobPlan:
    """The job a broken variant is wrong for, planned so that the defect shows."""
    prompt = f"{VICTIM} of {broken}"
    if broken == IGNORE_CANCEL:  # runs on for seconds past the cancel's stop bound
        return JobPlan(index, 0.3, prompt, 500, behaviour=CANCEL, at_chunk=3)
    if broken == LOSE_ENQUEUE:  # its caller gives up after the queue wait
        return JobPlan(index, 0.3, prompt, 30, queue_timeout=2.0)
    if broken == WRITE_AFTER_FENCE:  # still running seconds after its takeover
        return JobPlan(index, 0.3, prompt, 500)
    return JobPlan(index, 0.3, prompt, 60)


def small_schedule(seed: int, broken: str) -> Schedule:
    """The smallest schedule that shows ``broken``: one worker, the simulated engine,
    two ordinary jobs beside the victim, no faults."""
    rng = random.Random(seed)
    jobs = tuple(JobPlan(i, 0.1 * i, f"chaos job {i} {rng.getrandbits(32):08x}", 20)
                 for i in range(2))
    jobs += (_victim(len(jobs), broken),)
    faults: tuple[FaultPlan, ...] = ()
    if broken == DROP_LOG_ENTRY:
        faults = (FaultPlan(0.5, DROP_LOG_ENTRY, 5.0),)
    return Schedule(seed, SIMULATED, 1, 4, jobs, faults, {"simulated_step_ms": 10}, broken,
                    small=True)


def make_schedule(seed: int, *, scenario: str | None = None,
                  broken: str | None = None, small: bool = False) -> Schedule:
    """The schedule of ``seed`` (``scenario`` forces one; ``broken`` adds a defect;
    ``small`` with ``broken``: ``small_schedule``)."""
    if small and broken:
        return small_schedule(seed, broken)
    rng = random.Random(seed)
    chosen = rng.choices(SCENARIOS, _SCENARIO_WEIGHTS)[0]
    scenario = scenario or chosen
    if scenario == PRESSURE:
        return _pressure(rng, seed, broken, _extras_rng(seed) if broken is None else None)
    workers = rng.choice((1, 2, 2, 3))
    concurrency = rng.choice((4, 8))
    jobs = tuple(_simulated_job(rng, i) for i in range(rng.randint(8, 16)))
    kinds = [WORKER_KILL, WORKER_STOP, PAUSE_WRITES, WORKER_CUT, WORKER_BLACKHOLE, REDIS_LATENCY]
    kinds += ([PRIMARY_KILL, REPLICA_LAG] if scenario == SENTINEL
              else [NOREPLICAS, MISCONF, REDIS_RESTART])
    faults = _faults(rng, kinds, workers, rng.randint(2, 4))
    settings: dict[str, object] = {"simulated_step_ms": rng.choice((10, 20, 30))}
    if broken == DROP_LOG_ENTRY:  # a victim long enough to have log entries mid-stream
        jobs += (JobPlan(len(jobs), 0.0, "chaos victim of a lost log entry", 300),)
        faults = tuple(sorted((*faults, FaultPlan(1.5, DROP_LOG_ENTRY, 5.0)),
                              key=lambda f: f.at))
    elif broken is not None:
        jobs += (_victim(len(jobs), broken),)
    schedule = Schedule(seed, scenario, workers, concurrency, jobs, faults, settings, broken)
    # The caller, sampling and worker-process draws come from a generator of their own,
    # so the draws above (and the schedules of seeds chosen for them) stay as they were.
    return _with_extras(schedule, _extras_rng(seed)) if broken is None else schedule


def _simulated_job(rng: random.Random, index: int) -> JobPlan:
    behaviour = rng.choices(BEHAVIOURS, _BEHAVIOUR_WEIGHTS)[0]
    max_tokens = rng.randint(20, 160)
    return JobPlan(
        index=index,
        start_at=rng.uniform(0.0, LOAD_S * 0.7),
        prompt=f"chaos job {index} {rng.getrandbits(32):08x} " + "word " * rng.randint(0, 40),
        max_tokens=max_tokens,
        n=rng.choice((1, 1, 1, 2)),
        behaviour=behaviour,
        at_chunk=rng.randint(1, max(1, max_tokens // 2)),
        pause_s=rng.uniform(0.01, 0.05) if behaviour == SLOW else rng.uniform(0.2, 2.0),
        queue_timeout=rng.choice((None, None, None, 2.0, 4.0)),
    )


def _faults(rng: random.Random, kinds: list[str], workers: int,
            count: int) -> tuple[FaultPlan, ...]:
    """``count`` faults; Redis faults never overlap each other; at most one kill of the
    primary and, after it, at most one failback. A blackhole lasts long enough (up to
    7.5 s) to outlast the workers' 5 s socket timeout about a third of the time."""
    faults: list[FaultPlan] = []
    redis_busy_until = 0.0
    for _ in range(count):
        kind = rng.choice(kinds)
        at = rng.uniform(0.5, LOAD_S)
        duration = rng.uniform(0.5, 3.0)
        magnitude = 0.0
        if kind == WORKER_BLACKHOLE:
            duration *= 2.5
        elif kind == REDIS_LATENCY:
            magnitude = rng.uniform(0.02, 0.3)
        elif kind == REPLICA_LAG:
            magnitude = rng.uniform(0.25, 0.6)
        if kind in REDIS_FAULTS:
            at = max(at, redis_busy_until + 0.5)
            redis_busy_until = at + duration + 2.0
            if kind == PRIMARY_KILL:
                kinds = [k for k in kinds if k != PRIMARY_KILL] + [FAILBACK]
            elif kind == FAILBACK:
                kinds = [k for k in kinds if k != FAILBACK]
        faults.append(FaultPlan(at, kind, duration, rng.randrange(workers), magnitude))
    return tuple(sorted(faults, key=lambda f: f.at))


def _pressure(rng: random.Random, seed: int, broken: str | None,
              extra: random.Random | None) -> Schedule:
    """Low-priority jobs first, then high-priority ones that need their blocks: the small
    pool forces preemption; a worker may die or stall meanwhile."""
    low = [JobPlan(index=i, start_at=rng.uniform(0.0, 0.3),
                   prompt=f"pressure low {i} {rng.getrandbits(24):06x}",
                   max_tokens=rng.randint(100, 160), priority=0,
                   behaviour=rng.choice((STREAM, GENERATE, RESUME)),
                   at_chunk=rng.randint(5, 40), pause_s=rng.uniform(0.2, 1.5))
           for i in range(rng.randint(1, 3))]
    high = [JobPlan(index=len(low) + i, start_at=rng.uniform(0.4, 1.2),
                    prompt=f"pressure high {i} {rng.getrandbits(24):06x}",
                    max_tokens=rng.randint(30, 80), priority=10,
                    behaviour=rng.choice((STREAM, GENERATE, SLOW, CANCEL)),
                    at_chunk=rng.randint(5, 30), pause_s=rng.uniform(0.01, 0.03))
            for i in range(rng.randint(4, 7))]
    workers = rng.choice((1, 2))
    faults = _faults(rng, [WORKER_KILL, WORKER_STOP, PAUSE_WRITES, NOREPLICAS, WORKER_CUT,
                            REDIS_LATENCY], workers, rng.randint(1, 2))
    if extra is not None:  # sampled, n > 1 and best_of jobs, before the pool is sized
        from chaos.extras import sampled

        low = [sampled(extra, job, choices=True) for job in low]
        high = [sampled(extra, job, choices=True) for job in high]
    # Blocks of 16 tokens for about a quarter of what each worker's jobs would hold at once:
    # the low-priority jobs are still running when the high-priority ones arrive, so the
    # pool runs out while both are in it.
    # Never fewer than the longest job needs alone: each must be able to finish.
    # Each choice (each candidate, with best_of) needs its own blocks for what it generates.
    def tokens(job: JobPlan) -> int:
        return len(job.prompt) // 3 + max(job.n, job.best_of or 1) * job.max_tokens

    need = sum(tokens(j) for j in low + high) // 16
    # (a partial block per choice, and one to spare)
    longest = max(tokens(j) // 16 + 1 + max(j.n, j.best_of or 1) for j in low + high)
    blocks = max(8, longest, need // (4 * workers))
    schedule = Schedule(seed, PRESSURE, workers, 8, tuple(low + high), faults,
                        {"preemption_mode": "recompute", "kv_blocks": blocks}, broken)
    return _with_extras(schedule, extra) if extra is not None else schedule


def _extras_rng(seed: int) -> random.Random:
    """The generator of a seed's later draws (``chaos.extras``): apart from the first,
    so adding draws there leaves every earlier draw of every seed as it was."""
    return random.Random(f"chaos extras {seed}")


def _with_extras(schedule: Schedule, extra: random.Random) -> Schedule:
    from chaos.extras import with_extras  # it builds on this module's names

    return with_extras(schedule, extra)

