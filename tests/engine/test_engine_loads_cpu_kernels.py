"""A CPU engine loads (on a machine's first start: compiles) the C++ kernels while it is
built, so a compile delays the worker's ready line, never a first job's first token."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import kvrelay_worker.engine.llm_engine as llm_engine_module
from kvrelay_worker.engine.llm import LLM


def test_the_kernels_are_loaded_before_the_engine_takes_a_request(
        tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[int] = []
    real = llm_engine_module.load_cpu_kernels
    monkeypatch.setattr(llm_engine_module, "load_cpu_kernels",
                        lambda: loaded.append(1) or real())
    llm = LLM(str(tiny_model("llama-mqa")), device="cpu", dtype="float32", num_kv_blocks=8)
    assert loaded == [1]
    assert llm.engine.stats()["requests"] == 0


def test_the_reference_switch_builds_nothing(
        tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVRELAY_KERNELS", "reference")
    loaded: list[int] = []
    monkeypatch.setattr(llm_engine_module, "load_cpu_kernels", lambda: loaded.append(1))
    LLM(str(tiny_model("llama-mqa")), device="cpu", dtype="float32", num_kv_blocks=8)
    assert loaded == []
