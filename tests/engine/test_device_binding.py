"""The engine's thread makes the engine's CUDA device current before anything is built.

No GPU here, so the machine's facts are stood in for (CUDA available, two devices, the
current one) and the one call that reaches the driver, ``torch._C._cuda_setDevice``, is
replaced by a recorder. ``torch.cuda.set_device`` itself runs for real: torch's own
validation of its argument (``_get_device_index``, which refuses a ``cuda`` device without
an index) sees exactly what a GPU host would. The steps after the call under test are
recorders that stop the build. What is checked: the index torch accepted, and that
``set_device`` comes first, on the thread that builds and steps.
benchmarks/gpu_check.sh runs a real engine on ``cuda:1`` where a host has two GPUs.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import kvrelay_worker.engine.engine_model as engine_model_module
import kvrelay_worker.engine.engine_parts as engine_parts_module
import kvrelay_worker.loading.model_files as loader_module
from kvrelay_worker.engine import EngineConfig, LLMEngine
from kvrelay_worker.engine.errors import EngineConfigError
from kvrelay_worker.engine_service import EngineService


class Stop(Exception):
    """Ends the build once the recorded call has happened."""


def stand_in_for_two_gpus(monkeypatch: pytest.MonkeyPatch, current: int = 0
                          ) -> list[tuple[str, Any]]:
    """Two CUDA devices, ``current`` the current one; what torch's real ``set_device``
    passes on to the driver is recorded (as the ``torch.device`` of that index) with the
    calling thread."""
    log: list[tuple[str, Any]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)

    def driver_set_device(index: int) -> None:
        assert isinstance(index, int), f"the driver is handed {index!r}, not an index"
        log.append(("set_device", (torch.device("cuda", index),
                                   threading.current_thread().name)))

    monkeypatch.setattr(torch._C, "_cuda_setDevice", driver_set_device, raising=False)
    return log


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    return stand_in_for_two_gpus(monkeypatch)


def test_torch_itself_refuses_a_cuda_device_without_an_index(
        calls: list[tuple[str, Any]]) -> None:
    """The stand-in keeps torch's validation: the call the old ``bind_device`` made fails."""
    with pytest.raises(ValueError, match="specified index"):
        torch.cuda.set_device(torch.device("cuda"))
    assert calls == []


@pytest.mark.parametrize(("device", "current", "index"), [
    ("cuda", 0, 0), ("cuda", 1, 1), ("cuda:0", 1, 0), ("cuda:1", 0, 1), ("auto", 0, 0),
    ("auto", 1, 1),
])
def test_every_cuda_spelling_reaches_set_device_with_an_index_torch_accepts(
        device: str, current: int, index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The configuration's device goes through ``bind_device`` as the engine passes it."""
    from kvrelay_worker.engine.runner.device import bind_device

    calls = stand_in_for_two_gpus(monkeypatch, current)
    config = EngineConfig(device=device)
    assert config.torch_device == torch.device("cuda", index)
    bind_device(config.torch_device)
    assert calls == [("set_device", (torch.device("cuda", index),
                                     threading.current_thread().name))]


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_llm_on_cuda_gets_past_binding_its_device(
        device: str, calls: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """``LLM(device="cuda")``'s own construction path, up to loading the weights."""
    from kvrelay_worker.engine import LLM

    monkeypatch.setattr(loader_module, "load_model_source", _recorder(calls, "load",
                                                                      stop=True))
    with pytest.raises(Stop):
        LLM("any-model", device=device)
    thread = threading.current_thread().name
    assert calls == [("set_device", (torch.device("cuda:0"), thread)), ("load", thread)]


def _recorder(log: list[tuple[str, Any]], name: str, result: Any = None,
              stop: bool = False) -> Any:
    def record(*args: Any, **kwargs: Any) -> Any:
        log.append((name, threading.current_thread().name))
        if stop:
            raise Stop
        return result
    return record


def test_engine_sets_its_device_before_loading_or_building(
        calls: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    files = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64, extra={}),
                            weights=lambda: iter(()), tokenizer=None, name="fake",
                            source=SimpleNamespace(kind="hf_folder"))
    monkeypatch.setattr(loader_module, "load_model_source", _recorder(calls, "load", files))
    monkeypatch.setattr(engine_model_module, "build_model", _recorder(calls, "build", stop=True))
    with pytest.raises(Stop):
        LLMEngine(EngineConfig(device="cuda:1"))
    thread = threading.current_thread().name
    assert calls == [("set_device", (torch.device("cuda:1"), thread)), ("load", thread),
                     ("build", thread)]


def test_engine_around_a_built_model_sets_its_device_before_the_runner(
        calls: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=8, eos_token_ids=[1]))
    monkeypatch.setattr(engine_parts_module, "ModelRunner", _recorder(calls, "runner", stop=True))
    with pytest.raises(Stop):
        LLMEngine.from_model(EngineConfig(device="cuda:1"), model, None)  # type: ignore[arg-type]
    assert [name for name, _ in calls] == ["set_device", "runner"]
    assert calls[0][1][0] == torch.device("cuda:1")


@pytest.mark.parametrize(("device", "bound"), [("cuda:1", "cuda:1"), ("cuda", "cuda:0")])
def test_engine_thread_sets_the_device_of_an_engine_built_elsewhere(
        device: str, bound: str, calls: list[tuple[str, Any]]) -> None:
    """A worker may be handed a ready engine; the thread that steps it binds its device
    (one whose device carries no index binds the current one)."""
    engine = SimpleNamespace(device=torch.device(device),
                             has_unfinished_requests=lambda: False, stats=dict)
    service = EngineService(lambda: engine, publisher=None, metrics=None)  # type: ignore[arg-type,return-value]
    try:
        assert service.start() is engine
    finally:
        service.stop()
    assert calls == [("set_device", (torch.device(bound), "kvrelay-engine"))]


def test_a_device_index_past_the_visible_devices_is_refused(
        calls: list[tuple[str, Any]]) -> None:
    with pytest.raises(EngineConfigError, match="only 2 CUDA device"):
        EngineConfig(device="cuda:2")


def test_engine_start_refuses_a_device_without_room_for_the_kernels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked when the runner is built, not at the first step's kernel launch."""
    from kvrelay_kernels.triton_kernels import launch_config
    from kvrelay_worker.engine.runner.model_runner import ModelRunner

    monkeypatch.setattr(launch_config, "_shared_memory_optin", lambda index: 16 * 1024)
    monkeypatch.setattr(launch_config, "_sm_count", lambda index: 132)
    model = SimpleNamespace(config=SimpleNamespace(num_attention_heads=32,
                                                   num_key_value_heads=8, head_dim=128))
    with pytest.raises(EngineConfigError, match=r"shared memory.*\(device cuda:1\)"):
        ModelRunner(model, 16, torch.device("cuda:1"), torch.float32)  # type: ignore[arg-type]
