"""A sticky CUDA error is raised whole by the engine, not pinned on a request.

The errors are built as torch and Triton build them (``torch.AcceleratorError`` with the
CUDA runtime's text after "CUDA error: ", Triton's "Triton Error [CUDA]: "), and one is
raised from inside the model's forward pass of a real engine on the CPU. Before this,
``step()`` bisected the batch and failed every request, one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.engine_run import one_torch_thread

from kvrelay_worker.engine import LLM, LLMEngine, SamplingParams
from kvrelay_worker.engine.runner.device_errors import STICKY_CUDA_ERRORS, is_sticky_device_error

ILLEGAL_ADDRESS = ("CUDA error: an illegal memory access was encountered\n"
                   "CUDA kernel errors might be asynchronously reported at some other API "
                   "call, so the stacktrace below might be incorrect.")


def torch_cuda_error(text: str = ILLEGAL_ADDRESS) -> RuntimeError:
    accelerator_error: type[RuntimeError] = getattr(torch, "AcceleratorError", RuntimeError)
    return accelerator_error(text)


@pytest.mark.parametrize("text", sorted(STICKY_CUDA_ERRORS))
def test_every_sticky_cuda_error_torch_reports_is_recognised(text: str) -> None:
    assert is_sticky_device_error(torch_cuda_error(f"CUDA error: {text}"))
    assert is_sticky_device_error(RuntimeError(f"Triton Error [CUDA]: {text}"))


def test_an_error_raised_from_a_sticky_one_is_sticky() -> None:
    def sample() -> None:
        try:
            raise torch_cuda_error()
        except RuntimeError as inner:
            raise ValueError("sampling failed") from inner

    with pytest.raises(ValueError, match="sampling failed") as raised:
        sample()
    assert is_sticky_device_error(raised.value)


@pytest.mark.parametrize("exc", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("shape '[4, 8]' is invalid for input of size 30"),
    ValueError("an illegal memory access was encountered"),  # not torch's error type
    IndexError("index 70000 is out of bounds"),
], ids=["out-of-memory", "shape", "not-a-runtime-error", "index"])
def test_recoverable_errors_are_not_sticky(exc: BaseException) -> None:
    assert not is_sticky_device_error(exc)


@pytest.fixture(scope="module")
def engine(tiny_model: Callable[[str], Path]) -> Iterator[LLMEngine]:
    with one_torch_thread():
        yield LLM(str(tiny_model("llama-mqa")), device="cpu", dtype="float32",
                  num_kv_blocks=64, max_model_len=256).engine


def _fail_forward(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch,
                  error: BaseException) -> list[int]:
    calls: list[int] = []

    def forward(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise error

    monkeypatch.setattr(engine.model, "forward", forward)
    return calls


def _add(engine: LLMEngine, count: int) -> list[str]:
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    ids = [f"sticky-{i}" for i in range(count)]
    for i, request_id in enumerate(ids):
        engine.add_request(request_id, [5 + i, 17, 300, 42], params)
    return ids


def test_a_sticky_error_in_the_forward_pass_is_raised_not_bisected(
        engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = _add(engine, 4)
    calls = _fail_forward(engine, monkeypatch, torch_cuda_error())
    with pytest.raises(RuntimeError, match="illegal memory access"):
        engine.step()
    assert len(calls) == 1, "the batch was retried in parts on a lost device"
    assert all(engine.requests[r].error is None for r in ids), "a request was blamed"
    monkeypatch.undo()
    for request_id in ids:
        engine.abort_request(request_id)
    engine.step()
    assert not engine.has_unfinished_requests()


def test_an_ordinary_error_still_fails_requests_alone(
        engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The contrast: a recoverable error is bisected down to requests, as before."""
    ids = _add(engine, 4)
    calls = _fail_forward(engine, monkeypatch, RuntimeError("a bad request's tensor"))
    outputs = engine.step()
    assert len(calls) > 1
    assert {o.request_id for o in outputs if o.error is not None} == set(ids)
    monkeypatch.undo()
    assert not engine.has_unfinished_requests()
