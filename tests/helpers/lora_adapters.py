"""LoRA adapters made by ``peft`` on a real base model, and their merged references.

Adapters are built the way people build them (``get_peft_model`` then ``save_pretrained``),
with ``init_lora_weights=False`` so that B is random and non-zero (PEFT's default B is
zero: an adapter that changes nothing would prove nothing). Each is built once per test
session, in a folder named by its recipe; the merged reference is PEFT's own
``merge_and_unload`` in float32 on CPU.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from helpers.hf_reference import hf_greedy, load_hf_model
from helpers.tiny_models import TOKENIZER_FILES

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class AdapterRecipe:
    """How one test adapter is made: rank, targets, ``lora_alpha``, rsLoRA, seed."""

    rank: int
    targets: tuple[str, ...]
    alpha: int
    rslora: bool = False
    seed: int = 0

    @property
    def key(self) -> str:
        kind = "rs" if self.rslora else "lora"
        return f"{kind}-r{self.rank}-a{self.alpha:g}-s{self.seed}-" + "-".join(self.targets)


# The adapters the LoRA tests share (built once per session, whichever test asks first).
RECIPES = {
    "attn-r8": AdapterRecipe(8, ATTENTION, alpha=16, seed=1),
    "mlp-r16": AdapterRecipe(16, MLP, alpha=64, seed=2),  # the MLP needs a strong one
    "all-r64": AdapterRecipe(64, ATTENTION + MLP, alpha=32, seed=3),
    "rslora-r16": AdapterRecipe(16, ("q_proj", "v_proj", "up_proj", "down_proj"), alpha=8,
                                rslora=True, seed=4),
}


def build_adapter(base_folder: Path, recipe: AdapterRecipe, root: Path) -> Path:
    """The folder of ``recipe``'s adapter on ``base_folder``'s model (built if missing)."""
    return make_peft_adapter(base_folder, root / recipe.key, seed=recipe.seed,
                             rank=recipe.rank, targets=recipe.targets, alpha=recipe.alpha,
                             rslora=recipe.rslora)


def make_peft_adapter(base_folder: Path, folder: Path, *, seed: int, rank: int = 8,
                      targets: tuple[str, ...] = ATTENTION + MLP, alpha: int = 16,
                      rslora: bool = False) -> Path:
    """A PEFT adapter of ``base_folder``'s model written to ``folder`` (random non-zero
    A and B from ``seed``); returns ``folder``."""
    from peft import LoraConfig, get_peft_model

    if (folder / "adapter_model.safetensors").is_file():
        return folder
    model = load_hf_model(base_folder)
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                        use_rslora=rslora, init_lora_weights=False, lora_dropout=0.0)
    get_peft_model(model, config).save_pretrained(str(folder))
    return folder


def peft_greedy(base_folder: Path, adapter: Path | None, prompt: list[int],
                max_new_tokens: int) -> list[int]:
    """Greedy tokens of the base model with ``adapter`` merged by PEFT (None: the base
    alone), never stopping at EOS."""
    model = load_hf_model(base_folder) if adapter is None else merged_model(base_folder,
                                                                             adapter)
    return hf_greedy(model, [prompt], max_new_tokens)[0]


def merged_model(base_folder: Path, adapter: Path) -> PreTrainedModel:
    """The base model with the adapter merged in by PEFT (float32, CPU, eval mode)."""
    from peft import PeftModel

    base = load_hf_model(base_folder)
    merged: PreTrainedModel = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    return merged.eval()


def merged_folder(base_folder: Path, adapter: Path, root: Path) -> Path:
    """A model folder of the merged weights (with the base's tokenizer): an engine built
    on it is what the base engine plus the adapter must equal, feature for feature."""
    folder = root / f"merged-{adapter.name}"
    if (folder / "config.json").is_file():
        return folder
    merged_model(base_folder, adapter).save_pretrained(str(folder))
    for name in TOKENIZER_FILES:
        if (base_folder / name).is_file():
            shutil.copyfile(base_folder / name, folder / name)
    return folder


def adapter_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder per session for every adapter the engine's LoRA tests build."""
    root = tmp_path_factory.getbasetemp() / "engine-lora-adapters"
    root.mkdir(exist_ok=True)
    return root
