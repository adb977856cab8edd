"""Reading PEFT adapter folders: PEFT's scaling, and clear refusals of what cannot be served.

Every adapter here is made by ``peft`` on the tiny random ``llama-mqa`` model (fast to
build); the refusals are of adapters people do make (DoRA, an adapted LM head, per-module
ranks, an adapter of another model), each named in the error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.hf_reference import load_hf_model
from safetensors.torch import load_file

from kvrelay_worker.engine.errors import LoraAdapterError
from kvrelay_worker.loading import load_model_source
from kvrelay_worker.loading.lora_folder import read_lora_folder
from kvrelay_worker.models.model_config import ModelConfig

TINY = "llama-mqa"


@pytest.fixture(scope="module")
def tiny(tiny_model: Callable[[str], Path]) -> tuple[Path, ModelConfig]:
    folder = tiny_model(TINY)
    return folder, load_model_source(str(folder)).config


def _adapter(base: Path, folder: Path, **lora: Any) -> Path:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    options = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "down_proj"],
               "init_lora_weights": False, **lora}
    get_peft_model(load_hf_model(base), LoraConfig(**options)).save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize(("rslora", "scaling"), [(False, 16 / 8), (True, 16 / math.sqrt(8))])
def test_scaling_is_pefts_and_is_folded_into_b(tiny: tuple[Path, ModelConfig], tmp_path: Path,
                                               rslora: bool, scaling: float) -> None:
    base, config = tiny
    folder = _adapter(base, tmp_path / "a", use_rslora=rslora)
    weights = read_lora_folder(folder, config, max_rank=16)
    assert weights.rank == 8
    assert weights.scaling == pytest.approx(scaling)
    assert weights.targets == ("q_proj", "down_proj")
    saved = load_file(str(folder / "adapter_model.safetensors"))
    a, b = weights.pairs[(1, "down_proj")]
    prefix = "base_model.model.model.layers.1.mlp.down_proj"
    torch.testing.assert_close(a, saved[f"{prefix}.lora_A.weight"])
    torch.testing.assert_close(b, saved[f"{prefix}.lora_B.weight"] * scaling)
    assert len(weights.pairs) == 2 * config.num_hidden_layers


@pytest.mark.parametrize(("lora", "message"), [
    ({"target_modules": ["q_proj", "lm_head"]}, "changes 'lm_head'; only q_proj, k_proj"),
    ({"target_modules": ["embed_tokens"]}, "changes 'model.embed_tokens'"),
    ({"use_dora": True}, "DoRA"),
    ({"rank_pattern": {"q_proj": 4}}, "per-module ranks"),
    ({"r": 32}, "rank 32 is over the engine's max_lora_rank \\(16\\)"),
])
def test_unservable_adapters_are_refused_by_name(tiny: tuple[Path, ModelConfig],
                                                 tmp_path: Path, lora: dict[str, Any],
                                                 message: str) -> None:
    base, config = tiny
    folder = _adapter(base, tmp_path / "a", **lora)
    with pytest.raises(LoraAdapterError, match=message):
        read_lora_folder(folder, config, max_rank=16)


def test_an_adapter_of_another_model_is_refused(tiny: tuple[Path, ModelConfig],
                                                smollm2_folder: Path, tmp_path: Path) -> None:
    base, _ = tiny
    folder = _adapter(base, tmp_path / "a")
    smollm2 = load_model_source(str(smollm2_folder)).config
    with pytest.raises(LoraAdapterError, match="an adapter of another model"):
        read_lora_folder(folder, smollm2, max_rank=16)


def test_broken_folders_are_refused(tiny: tuple[Path, ModelConfig], tmp_path: Path) -> None:
    base, config = tiny
    with pytest.raises(LoraAdapterError, match="not a PEFT adapter folder"):
        read_lora_folder(tmp_path, config, max_rank=16)
    folder = _adapter(base, tmp_path / "a")
    (folder / "adapter_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(LoraAdapterError, match="cannot read the adapter"):
        read_lora_folder(folder, config, max_rank=16)
    (folder / "adapter_model.safetensors").unlink()
    with pytest.raises(LoraAdapterError, match=r"has no adapter_model\.safetensors"):
        read_lora_folder(folder, config, max_rank=16)
    folder = _adapter(base, tmp_path / "b")
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "IA3"}))
    with pytest.raises(LoraAdapterError, match="IA3 adapter"):
        read_lora_folder(folder, config, max_rank=16)
