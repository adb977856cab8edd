"""The worker's start line says which CPU threading and which quantized kernels its engine
runs under."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch
from helpers.worker_process import WorkerProcess

from kvrelay_kernels.cpu_quantized_matmul import cpu_kernel_names
from kvrelay_worker.cpu_threads import (
    THREAD_ENV_VARS,
    ThreadChoice,
    cpu_thread_settings,
    describe_cpu_threads,
)
from kvrelay_worker.usable_cpus import usable_cpus


def test_the_settings_name_both_pools_and_every_thread_variable_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THREAD_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_PROC_BIND", "close")
    monkeypatch.setenv("KMP_AFFINITY", "granularity=fine,compact")
    settings = cpu_thread_settings()
    assert settings["intra_op_threads"] == torch.get_num_threads()
    assert settings["inter_op_threads"] == torch.get_num_interop_threads()
    assert settings["OMP_PROC_BIND"] == "close"
    assert "OMP_NUM_THREADS" not in settings
    line = describe_cpu_threads()
    assert line.startswith(f"intra-op {torch.get_num_threads()}, "
                           f"inter-op {torch.get_num_interop_threads()}, of ")
    why = ThreadChoice(None, "KVRELAY_CPU_THREADS unset, torch's from OMP_NUM_THREADS=1")
    assert describe_cpu_threads(why).startswith(
        f"intra-op {torch.get_num_threads()} ({why.reason}), inter-op ")
    assert line.endswith("OMP_PROC_BIND=close KMP_AFFINITY=granularity=fine,compact")


def test_without_thread_variables_the_line_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THREAD_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    assert describe_cpu_threads().endswith("no OMP/KMP/MKL variables set")


def _ready_line(worker: WorkerProcess, timeout: float = 30.0) -> str:
    """The worker logs its ready line just after its first heartbeat: wait for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in worker.log_path.read_text(errors="replace").splitlines():
            if "kvrelay worker" in line and " ready: " in line:
                return line
        time.sleep(0.1)
    raise AssertionError(f"no ready line in the worker's log:\n{worker.tail()}")


@pytest.mark.integration
def test_a_real_workers_start_line_carries_its_thread_settings(
        start_worker: Callable[..., WorkerProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    """KVRELAY_CPU_THREADS wins over OMP_NUM_THREADS (which torch would size its pool
    from); the line's count is torch's own, read after the model loaded."""
    for name in THREAD_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    # The worker process inherits these.
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("KMP_BLOCKTIME", "0")
    line = _ready_line(start_worker("threads", cpu_threads=1))
    assert "CPU threads: intra-op 1 (KVRELAY_CPU_THREADS=1), inter-op " in line, line
    assert "OMP_NUM_THREADS=2 KMP_BLOCKTIME=0" in line, line


@pytest.mark.integration
def test_an_unset_worker_runs_one_thread_per_usable_cpu(
        start_worker: Callable[..., WorkerProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither KVRELAY_CPU_THREADS nor OMP_NUM_THREADS: the CPUs the affinity mask and the
    cgroup quota allow (torch's own default would count the machine's cores)."""
    for name in THREAD_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    usable = usable_cpus()
    line = _ready_line(start_worker("usable"))
    assert (f"CPU threads: intra-op {usable.count} (KVRELAY_CPU_THREADS unset: "
            f"{usable.describe()}), inter-op ") in line, line
    assert f"of {usable.count} usable CPUs, no OMP/KMP/MKL variables set" in line, line


@pytest.mark.integration
def test_a_quantized_cpu_workers_start_line_names_its_kernels(
        start_worker: Callable[..., WorkerProcess]) -> None:
    line = _ready_line(start_worker("int8", quantization="int8"))
    assert "(quantization int8 on integer dot (" in line, line
    assert f"(quantization int8 on {cpu_kernel_names()})" in line, line


@pytest.mark.integration
def test_a_default_cpu_worker_keeps_a_gguf_quantized(
        start_worker: Callable[..., WorkerProcess], smollm2_gguf: object) -> None:
    """``KVRELAY_QUANTIZATION=auto`` (the default): the GGUF model keeps its Q4_1 blocks."""
    line = _ready_line(start_worker("smol", model="smollm2-135m-instruct"), timeout=120)
    assert "(quantization gguf on integer dot (" in line, line


@pytest.mark.integration
def test_a_default_cpu_worker_keeps_float_weights_of_a_folder(
        start_worker: Callable[..., WorkerProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    """Float weights for a folder; and, KVRELAY_CPU_THREADS unset, the thread count
    OMP_NUM_THREADS asked for (as every worker the tests start runs)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    line = _ready_line(start_worker("folder"))
    assert "(quantization none)" in line, line
    assert ("CPU threads: intra-op 1 (KVRELAY_CPU_THREADS unset, torch's from "
            "OMP_NUM_THREADS=1), inter-op ") in line, line
