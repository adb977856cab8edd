"""The schedule draws every fault and job kind it claims to, and the later draws leave a
seed's earlier ones as they were (a seed chosen for its faults keeps them)."""

from __future__ import annotations

import random

from chaos.schedule import (
    CANCEL_RACE,
    ORPHAN,
    PRESSURE,
    PUBSUB_KILL,
    RACE,
    WORKER_DRAIN,
    _extras_rng,
    make_schedule,
)

SEEDS = range(1, 201)


def test_every_later_draw_happens_for_some_seed() -> None:
    schedules = [make_schedule(seed) for seed in SEEDS]
    faults = {f.kind for s in schedules for f in s.faults}
    assert {CANCEL_RACE, WORKER_DRAIN, PUBSUB_KILL} <= faults
    behaviours = {j.behaviour for s in schedules for j in s.jobs}
    assert {ORPHAN, RACE} <= behaviours
    assert any(s.clock_skew for s in schedules)
    assert any(s.placement for s in schedules)
    pressure = [j for s in schedules if s.scenario == PRESSURE for j in s.jobs]
    assert any(j.best_of for j in pressure)
    assert any(j.n > 1 for j in pressure)
    # Every sampled job has a seed (its reference is exact); best_of only on the tiny model.
    jobs = [j for s in schedules for j in s.jobs]
    assert all(j.seed is not None for j in jobs if j.temperature > 0)
    assert not any(j.best_of for s in schedules if s.scenario != PRESSURE for j in s.jobs)
    # A cancel race targets a job that races.
    for schedule in schedules:
        for fault in schedule.faults:
            if fault.kind == CANCEL_RACE:
                assert schedule.jobs[fault.target].behaviour == RACE


def test_the_later_draws_leave_the_earlier_ones_alone() -> None:
    for seed in (5, 8, 14):
        with_extras = make_schedule(seed)
        base = make_schedule(seed, broken="duplicate_token")  # no later draws
        assert [(j.prompt.endswith(b.prompt), j.max_tokens, j.start_at, j.n)
                for j, b in zip(with_extras.jobs, base.jobs, strict=False)] == \
            [(True, b.max_tokens, b.start_at, b.n) for b in base.jobs[:len(with_extras.jobs)]]
        base_faults = [(f.kind, f.at) for f in base.faults]
        assert [(f.kind, f.at) for f in with_extras.faults
                if (f.kind, f.at) in base_faults] == base_faults
    # The later draws' generator depends on the seed alone.
    assert _extras_rng(3).random() == _extras_rng(3).random() != random.Random(3).random()
