"""Step times reach the pacer and the speculation curve with the device's work counted.

A fake device stands in for CUDA's asynchrony: a forward pass returns to the host after
1 ms of "launch" while its work runs on until 50 ms later, on a fake clock; waiting for
the device moves the clock to that moment. A prompt longer than the token budget gives
steps in which no row samples, so nothing reads a result back. Before, such a step was
timed by the host clock alone: its launch time.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvrelay_worker.engine import LLM, LLMEngine, SamplingParams
from kvrelay_worker.engine.sched.step_timer import StepTimer, wait_for_cuda_stream

pytestmark = pytest.mark.usefixtures("one_thread")

LAUNCH_S = 0.001
DEVICE_WORK_S = 0.050


class FakeDevice:
    """Queued work finishes at ``busy_until`` on the fake clock ``now``."""

    def __init__(self) -> None:
        self.now = 100.0
        self.busy_until = 100.0

    def clock(self) -> float:
        return self.now

    def launch(self) -> None:
        self.now += LAUNCH_S
        self.busy_until = max(self.busy_until, self.now) + DEVICE_WORK_S

    def wait(self) -> None:
        self.now = max(self.now, self.busy_until)


def test_the_timer_waits_for_the_device_before_reading_the_clock() -> None:
    device = FakeDevice()
    timer = StepTimer(clock=device.clock, wait_for_device=device.wait)
    timer.start()
    device.launch()
    assert timer.elapsed_ms() == pytest.approx((LAUNCH_S + DEVICE_WORK_S) * 1e3)
    host_only = StepTimer(clock=device.clock)
    host_only.start()
    device.launch()
    assert host_only.elapsed_ms() == pytest.approx(LAUNCH_S * 1e3)


def test_a_cuda_engine_times_its_steps_through_the_stream() -> None:
    timer = StepTimer.for_device(torch.device("cuda", 0))
    assert timer.wait_for_device.__qualname__ == wait_for_cuda_stream(
        torch.device("cuda", 0)).__qualname__
    cpu = StepTimer.for_device(torch.device("cpu"))
    assert cpu.wait_for_device.__qualname__ != timer.wait_for_device.__qualname__


@pytest.fixture
def engine(folder: str) -> LLMEngine:
    return LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64,
               max_num_batched_tokens=16).engine


def test_steps_without_a_sampled_row_are_timed_to_the_end_of_device_work(
        engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    device = FakeDevice()
    engine.step_timer = StepTimer(clock=device.clock, wait_for_device=device.wait)
    forward = engine.model.forward

    def launching_forward(*args: Any, **kwargs: Any) -> Any:
        device.launch()
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", launching_forward)
    # Every step through model.forward, where the fake device launches its work (the
    # native CPU decode step would run the decode step without it).
    engine.runner.decode_runner = None
    observed: list[tuple[bool, float]] = []
    observe = engine.scheduler.observe_step

    def record(sched: Any, ms: float) -> None:
        observed.append((any(item.samples for item in sched.scheduled), ms))
        observe(sched, ms)

    monkeypatch.setattr(engine.scheduler, "observe_step", record)
    engine.add_request("long", [100 + i for i in range(40)],
                       SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    # The first 16 of the 40 prompt tokens sample nothing; the last step reads tokens back.
    assert not observed[0][0], observed
    assert observed[-1][0], observed
    for _, ms in observed:
        assert ms == pytest.approx((LAUNCH_S + DEVICE_WORK_S) * 1e3)
