"""A seed's later draws, from a generator of their own (``schedule._extras_rng``) so that
the first draws of every seed stay as they were: sampled jobs (a temperature and a seed,
so the reference stays exact), more choices (``n`` > 1, ``best_of`` on the tiny model),
callers that die or cancel as a worker dies, worker-process faults (SIGTERM drain, a
skewed wall clock), the SDK's pub/sub connections killed, and prefix-aware placement.
"""

from __future__ import annotations

import dataclasses
import random

from chaos.schedule import (
    CANCEL,
    CANCEL_RACE,
    GENERATE,
    LOAD_S,
    ORPHAN,
    PRESSURE,
    PUBSUB_KILL,
    RACE,
    SLOW,
    STREAM,
    WORKER_DRAIN,
    FaultPlan,
    JobPlan,
    Schedule,
)

# The share of jobs that sample (temperature > 0, seeded).
SAMPLED_SHARE = 0.3
# The share of simulated jobs whose caller runs in a child process that is SIGKILLed.
ORPHAN_SHARE = 0.08
# Chances per schedule.
CANCEL_RACE_CHANCE = 0.25
DRAIN_CHANCE = 0.25
PUBSUB_KILL_CHANCE = 0.25
CLOCK_SKEW_CHANCE = 0.25
PLACEMENT_CHANCE = 0.3
# A worker's wall clock is off by this many seconds at most (either way).
MAX_CLOCK_SKEW_S = 3.0


def sampled(rng: random.Random, job: JobPlan, *, choices: bool) -> JobPlan:
    """``job``, sampled (seeded) for some; with ``choices`` (the tiny model), also
    ``n`` = 2 for some and ``best_of`` for some sampled ones (the simulated engine has no
    logits: it refuses ``best_of``)."""
    changes: dict[str, object] = {}
    if rng.random() < SAMPLED_SHARE:
        changes.update(temperature=round(rng.uniform(0.6, 1.2), 2), seed=rng.getrandbits(32))
    if choices:
        n = 2 if rng.random() < 0.25 else job.n
        changes["n"] = n
        if "seed" in changes and rng.random() < 0.3:
            changes["best_of"] = n + 1
    return dataclasses.replace(job, **changes)  # type: ignore[arg-type]


def with_extras(schedule: Schedule, rng: random.Random) -> Schedule:
    """``schedule`` with the later draws added."""
    jobs = list(schedule.jobs)
    faults = list(schedule.faults)
    simulated = schedule.scenario != PRESSURE
    placement = simulated and rng.random() < PLACEMENT_CHANCE
    # A preamble of 256 characters or more: placement fingerprints 256-character chunks.
    preamble = f"shared preamble {rng.getrandbits(32):08x} " + "context " * 34
    for i, job in enumerate(jobs):
        if simulated:
            job = sampled(rng, job, choices=False)
            if placement:
                job = dataclasses.replace(job, prompt=preamble + job.prompt)
            if job.behaviour != CANCEL and rng.random() < ORPHAN_SHARE:
                job = dataclasses.replace(job, behaviour=ORPHAN, queue_timeout=None)
        jobs[i] = job
    if simulated and rng.random() < CANCEL_RACE_CHANCE:
        racers = [j for j in jobs if j.behaviour in (GENERATE, STREAM, SLOW)
                  and j.queue_timeout is None and j.max_tokens >= 60]
        if racers:
            racer = rng.choice(racers)
            jobs[racer.index] = dataclasses.replace(racer, behaviour=RACE)
            faults.append(FaultPlan(racer.start_at + rng.uniform(0.5, 1.5), CANCEL_RACE,
                                    rng.uniform(0.5, 2.0), racer.index))
    if rng.random() < DRAIN_CHANCE:
        faults.append(FaultPlan(rng.uniform(1.0, LOAD_S), WORKER_DRAIN, rng.uniform(0.5, 2.0),
                                rng.randrange(schedule.workers)))
    if rng.random() < PUBSUB_KILL_CHANCE:
        faults.append(FaultPlan(rng.uniform(0.5, LOAD_S), PUBSUB_KILL, 0.5))
    skew: dict[int, float] = {}
    if rng.random() < CLOCK_SKEW_CHANCE:
        skew[rng.randrange(schedule.workers)] = round(
            rng.choice((-1, 1)) * rng.uniform(1.0, MAX_CLOCK_SKEW_S), 2)
    return dataclasses.replace(schedule, jobs=tuple(jobs),
                               faults=tuple(sorted(faults, key=lambda f: f.at)),
                               clock_skew=skew, placement=placement)
