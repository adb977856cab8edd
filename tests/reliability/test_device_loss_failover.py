"""A worker whose GPU hits a sticky error exits non-zero, and its job moves to another.

Two real (simulated-engine) worker processes. Once the job's owner has streamed ten
tokens, its engine's steps start raising the error torch raises after an illegal memory
access (the owner's trigger file appears; the hook is a ``sitecustomize`` on the worker's
path, so the worker code is the production one). The owner must exit with
``DEVICE_LOST_EXIT_CODE`` without failing the job, and the other worker must take it over
when the lease expires: the caller sees one stream equal to an uninterrupted run. Before,
the worker failed the job as ``internal`` and every later one with it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.job_log import read_events, wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay import Client
from kvrelay.protocol import Failed, Started, Tokens
from kvrelay_worker.device_loss import DEVICE_LOST_EXIT_CODE
from kvrelay_worker.engine.runner.device_errors import is_sticky_device_error

pytestmark = pytest.mark.integration

JOB = {"prompt": "a question the simulated engine answers", "max_tokens": 150}
FAST = {"concurrency": 4, "simulated_step_ms": 20, "lease_ttl": 2.0, "lease_refresh": 0.5,
        "watchdog_interval": 0.5}
# torch's text for cudaErrorIllegalAddress (c10's CUDA check).
CUDA_ERROR = "CUDA error: an illegal memory access was encountered"
HOOK = f'''
"""Test hook: the simulated engine's steps raise a sticky CUDA error once the file that
DEVICE_FAULT_TRIGGER names exists."""
import os
from pathlib import Path

import kvrelay_worker.simulated.engine as simulated

_trigger = Path(os.environ["DEVICE_FAULT_TRIGGER"])
_step = simulated.SimulatedEngine.step


def step(self):
    if _trigger.exists():
        raise RuntimeError({CUDA_ERROR!r})
    return _step(self)


simulated.SimulatedEngine.step = step
'''


def test_the_injected_error_is_one_torch_reports_as_sticky() -> None:
    assert is_sticky_device_error(RuntimeError(CUDA_ERROR))


def test_a_worker_whose_gpu_is_lost_exits_and_its_job_moves(
        clean_redis_url: str, tmp_path: Path) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    workers = []
    for name in ("sim-a", "sim-b"):
        worker = WorkerProcess(name, clean_redis_url, "simulated", tmp_path, **FAST)
        worker.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(hook), worker.env.get("PYTHONPATH")) if p)
        worker.env["DEVICE_FAULT_TRIGGER"] = str(tmp_path / f"{name}.fault")
        workers.append(worker.start())
    passed = False
    try:
        for worker in workers:
            worker.wait_ready()
        owner: WorkerProcess | None = None
        seqs: list[int] = []
        with Client(clean_redis_url, model="simulated") as client:
            reference = client.generate(**JOB)
            with client.stream(**JOB) as stream:
                for chunk in stream:
                    seqs.append(chunk.seq)
                    if len(seqs) == 10:
                        events = read_events(clean_redis_url, stream.job_id)
                        started = [e for e in events if isinstance(e, Started)][-1]
                        pid = int(started.worker.rsplit(":", 1)[1])
                        owner = next(w for w in workers if w.pid == pid)
                        Path(owner.env["DEVICE_FAULT_TRIGGER"]).touch()
                final = stream.final()
                job_id = stream.job_id
        assert owner is not None
        assert owner.wait_exit(30) == DEVICE_LOST_EXIT_CODE
        assert "the GPU hit an unrecoverable error" in owner.tail(6000)
        events = wait_terminal(clean_redis_url, job_id)
        assert not [e for e in events if isinstance(e, Failed)], "the job was failed"
        started_events = [e for e in events if isinstance(e, Started)]
        assert [e.attempt for e in started_events] == [1, 2]
        assert len({e.worker for e in started_events}) == 2  # it did move
        assert seqs == [e.seq for e in events if isinstance(e, Tokens)]
        assert final.token_ids == reference.token_ids
        assert final.finish_reason == "length"
        passed = True
    finally:
        for worker in workers:
            worker.stop()
        if not passed:
            for worker in workers:
                print(f"\n----- worker {worker.name} log -----\n{worker.tail(6000)}")
