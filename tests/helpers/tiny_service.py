"""The worker's real ``EngineService`` on a tiny model, its publisher a recorder."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

from helpers.engine_run import one_torch_thread
from helpers.recording_publisher import RecordingPublisher
from kvrelay_worker.engine import LLM
from kvrelay_worker.engine_service import EngineService
from kvrelay_worker.jobs.publisher import Publisher
from kvrelay_worker.metrics import WorkerMetrics


@contextmanager
def tiny_service(folder: str, publisher: RecordingPublisher) -> Iterator[EngineService]:
    """A started service (one torch thread, 64 KV blocks, 256 tokens), stopped after."""
    with one_torch_thread():
        service = EngineService(
            lambda: LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64,
                        max_model_len=256).engine,
            cast(Publisher, publisher), WorkerMetrics("tiny"))
        service.start()
        try:
            yield service
        finally:
            service.stop()
