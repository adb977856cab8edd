"""The takeover throttle's accounting: a survivor admits a copy of a taken-over job while
its pending re-prefill stays within the target times its measured prefill rate, always
when it holds none, and counts a job only until its first new token. No wall time: the
hold's clock and sleeps are the test's."""

from __future__ import annotations

import pytest

from kvrelay.protocol import GenerateRequest
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.jobs.active_job import ActiveJob, Outcome
from kvrelay_worker.jobs.prior_progress import PriorProgress
from kvrelay_worker.jobs.takeover_throttle import TakeoverThrottle, hold_seconds


def held_job(job_id: str) -> ActiveJob:
    request = GenerateRequest(job_id=job_id, model="m", prompt_token_ids=[1, 2, 3])
    return ActiveJob(job_id=job_id, request=request, payload_json="{}",
                     params=SamplingParams(), prompt_ids=[1, 2, 3], attempt=2,
                     prior=PriorProgress())


class Clock:
    """The hold's time: each sleep moves it on, and may run a callback first."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0
        self.on_sleep: list[object] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        for action in self.on_sleep:
            action()  # type: ignore[operator]


def throttle(rate: float, held: list[ActiveJob], clock: Clock | None = None,
             target_s: float = 1.0) -> TakeoverThrottle:
    clock = clock or Clock()
    return TakeoverThrottle(target_s, rate=lambda: rate, held=lambda: held,
                            clock=lambda: clock.now, sleep=clock.sleep)


def test_copies_are_admitted_while_they_fit_the_budget() -> None:
    gate = throttle(rate=1000.0, held=[])  # budget: 1 s x 1000 tokens/s
    first = gate.try_admit("a", 600)
    second = gate.try_admit("b", 400)
    assert first is not None
    assert second is not None
    assert gate.pending_tokens() == 1000
    assert gate.try_admit("c", 1) is None


def test_a_worker_holding_no_re_prefill_always_admits() -> None:
    gate = throttle(rate=10.0, held=[])
    assert gate.try_admit("big", 1_000_000) is not None  # far past its budget
    assert gate.try_admit("next", 1) is None
    unknown = throttle(rate=0.0, held=[])  # no prefill measured yet: one at a time
    assert unknown.try_admit("a", 50) is not None
    assert unknown.try_admit("b", 50) is None


def test_a_job_stops_counting_at_its_first_new_token_or_its_end() -> None:
    jobs = [held_job("a"), held_job("b")]
    gate = throttle(rate=100.0, held=jobs)
    a, b = gate.try_admit("a", 80), gate.try_admit("b", 20)
    assert a is not None
    assert b is not None
    assert gate.pending_tokens() == 100
    jobs[0].first_token_at = 1.0  # re-prefilled: decoding now
    assert gate.pending_tokens() == 20
    jobs[1].finish(Outcome.FAILED)
    assert gate.pending_tokens() == 0
    a.release()
    b.release()
    b.release()  # twice is harmless
    assert gate.try_admit("c", 100) is not None


def test_a_copy_not_claimed_yet_counts_until_released() -> None:
    gate = throttle(rate=100.0, held=[])
    reservation = gate.try_admit("a", 70)
    assert reservation is not None
    assert gate.try_admit("b", 70) is None
    reservation.release()  # its claim found the job owned elsewhere
    assert gate.pending_tokens() == 0


def test_a_throttled_copy_is_held_then_handed_back_never_spun() -> None:
    clock = Clock()
    gate = throttle(rate=100.0, held=[], clock=clock)
    assert gate.try_admit("a", 100) is not None
    assert gate.admit("b", 50) is None
    assert clock.now >= gate.hold_s  # held for the whole hold before giving up
    assert clock.sleeps <= gate.hold_s / 0.05 + 1


def test_a_held_copy_is_admitted_as_soon_as_the_budget_frees() -> None:
    clock = Clock()
    jobs = [held_job("a")]
    gate = throttle(rate=100.0, held=jobs, clock=clock)
    assert gate.try_admit("a", 100) is not None

    def first_token() -> None:
        jobs[0].first_token_at = clock.now

    clock.on_sleep.append(first_token)
    assert gate.admit("b", 100) is not None
    assert clock.sleeps == 1


@pytest.mark.parametrize(("target_s", "hold_s"), [(0.1, 0.1), (2.0, 0.5), (60.0, 1.0)])
def test_the_hold_is_short_but_never_a_spin(target_s: float, hold_s: float) -> None:
    assert hold_seconds(target_s) == hold_s
