"""A worker serving SmolLM2 as the float32 Hugging Face folder transformers loads.

Scores compared with transformers within 1e-4 need the same weights computed in float32:
the registry name serves the GGUF kept quantized, whose kernels sum in another order
(about 1e-4 apart on a logprob of -12). The folder is served under the usual name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers.redis_db import fresh_db_url
from helpers.worker_process import WorkerProcess

MODEL = "smollm2-135m-instruct"


@contextmanager
def float32_smollm2_worker(redis_url: str, folder: Path, log_dir: Path,
                           db: int) -> Iterator[tuple[str, WorkerProcess]]:
    """``(redis url of database db, ready worker)``; stopped on exit."""
    url = fresh_db_url(redis_url, db)
    worker = WorkerProcess("smollm2-f32", url, str(folder), log_dir, concurrency=4,
                           model_name=MODEL, dtype="float32", quantization="none")
    worker.start()
    try:
        worker.wait_ready(timeout=180)
        yield url, worker
    finally:
        worker.stop()
