"""Fixtures shared by the gateway tests that speak to a tiny-model worker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.gateway_process import GatewayProcess
from helpers.worker_process import WorkerProcess
from openai import OpenAI


@pytest.fixture
def tiny_api(start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
             tmp_path: Path) -> Iterator[OpenAI]:
    """The real ``openai`` client in front of a real gateway and a worker on the tiny
    random model ``llama-mqa``."""
    start_worker(concurrency=4)
    gateway = GatewayProcess(clean_redis_url, tmp_path, "gateway").start()
    try:
        with OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                    timeout=60) as client:
            yield client
    finally:
        gateway.stop()
