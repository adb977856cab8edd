"""The LoRA adapters tests share (registered from tests/conftest.py): two PEFT adapters of
the tiny ``llama-mqa`` model, made once per session. ``peft`` is imported only when a
test asks for them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

# name -> seed of its random A and B: two adapters that differ from each other.
ADAPTER_SEEDS = {"tone": 11, "style": 23}


@pytest.fixture(scope="session")
def lora_adapters(tiny_model: Callable[[str], Path],
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"tone": folder, "style": folder}``: PEFT adapters of ``llama-mqa``."""
    from helpers.lora_adapters import make_peft_adapter
    from helpers.worker_fixtures import TINY

    base = tiny_model(TINY)
    root = tmp_path_factory.mktemp("lora-adapters")
    return {name: make_peft_adapter(base, root / name, seed=seed)
            for name, seed in ADAPTER_SEEDS.items()}
