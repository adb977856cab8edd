"""Fixtures that start real worker processes (registered from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.redis_db import fresh_db_url
from helpers.worker_process import WorkerProcess

TINY = "llama-mqa"
SMOLLM2 = "smollm2-135m-instruct"
TINY_KV_BYTES = 256 << 20


@pytest.fixture
def tiny_model_path(tiny_model: Callable[[str], Path]) -> str:
    return str(tiny_model(TINY))


@pytest.fixture
def start_worker(clean_redis_url: str, tiny_model_path: str, tmp_path: Path,
                 request: pytest.FixtureRequest) -> Iterator[Callable[..., WorkerProcess]]:
    """``start_worker(name, **KVRELAY_settings)`` -> a ready worker; all stopped at the end.

    The model defaults to the tiny random ``llama-mqa`` (served as "llama-mqa"). Worker
    logs are printed when the test fails, so a failure shows what the workers saw.
    """
    started: list[WorkerProcess] = []

    def start(name: str = "w1", ready: bool = True, **settings: Any) -> WorkerProcess:
        if "model" not in settings:
            # The tiny model's KV pool: 256 MiB is ~170k tokens, more than any test here
            # holds; the default 1 GiB (and its 1 GiB host pool) only slow each start.
            settings = {"kv_cache_memory": TINY_KV_BYTES, "swap_space_gib": 0.25} | settings
        model = settings.pop("model", tiny_model_path)
        worker = WorkerProcess(name, clean_redis_url, model, tmp_path, **settings)
        started.append(worker.start())
        return worker.wait_ready() if ready else worker

    yield start
    stop_and_show_logs(started, request, 6000)


def stop_and_show_logs(started: list[WorkerProcess], request: pytest.FixtureRequest,
                       chars: int) -> None:
    """Stop a test's workers; print each one's log tail when the test failed."""
    for worker in started:
        worker.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for worker in started:
            print(f"\n----- worker {worker.name} log -----\n{worker.tail(chars)}")


@pytest.fixture(scope="module")
def smollm2_worker(redis_url: str, smollm2_folder: Path,
                   tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[tuple[str, WorkerProcess]]:
    """One worker serving SmolLM2 for a whole test module, on a Redis database of its own.

    Yields ``(redis url, worker)``. Loading the model takes seconds, so modules share it.
    """
    url = fresh_db_url(redis_url, 11)
    worker = WorkerProcess("smollm2", url, SMOLLM2, tmp_path_factory.mktemp("smollm2-worker"),
                           concurrency=8)
    worker.start()
    try:
        worker.wait_ready(timeout=180)
        yield url, worker
    finally:
        worker.stop()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
    return rep
