"""Read a PEFT LoRA adapter folder and check it against the base model it will adapt.

A folder holds ``adapter_config.json`` and ``adapter_model.safetensors`` as PEFT's
``save_pretrained`` writes them. What the engine can serve, and refuses clearly otherwise:
plain LoRA (no DoRA, no bias, no extra trained modules, no per-module rank or alpha
patterns) on the seven projections of ``models/lora_layout.py``, of rank at most the
engine's ``max_lora_rank``, every matrix the shape the base model's projection takes.

The scaling is PEFT's: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with
``use_rslora``. It is folded into B here, in float32, so the engine only stacks.
Hugging Face names are resolved to a folder before this (as models are); this reads a
local folder only.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors

from kvrelay_worker.engine.errors import LoraAdapterError
from kvrelay_worker.models.lora_layout import LORA_TARGETS, adaptable_linears, target_places
from kvrelay_worker.models.model_config import ModelConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

_TENSOR = re.compile(
    r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])"
    r"\.weight$")
# Config switches that change what a LoRA computes; each must be off (or empty).
_UNSUPPORTED = {
    "use_dora": "DoRA", "lora_bias": "a LoRA bias", "modules_to_save": "extra trained modules",
    "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)", "fan_in_fan_out": "fan_in_fan_out",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "trainable_token_indices": "trained token embeddings (trainable_token_indices)",
    "target_parameters": "adapted parameters (target_parameters)",
    "layer_replication": "layer replication", "use_qalora": "QALoRA",
}


@dataclass(frozen=True)
class LoraWeights:
    """One adapter in host memory: per (layer, target) its A ``[r, in]`` and its B
    ``[out, r]`` with the scaling folded in, float32; ``digest`` names its content (the
    prefix cache keys its blocks by it)."""

    rank: int
    scaling: float
    targets: tuple[str, ...]
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    digest: str

    @property
    def num_bytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.pairs.values())


def read_lora_folder(folder: str | Path, config: ModelConfig, max_rank: int) -> LoraWeights:
    """The adapter in ``folder``, checked against ``config``; raises ``LoraAdapterError``
    saying what cannot be served."""
    folder = Path(folder)
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_path.is_file():
        raise LoraAdapterError(f"{folder} is not a PEFT adapter folder: no {CONFIG_FILE}")
    if not weights_path.is_file():
        other = " (only safetensors weights are read)" if (folder / "adapter_model.bin"
                                                           ).is_file() else ""
        raise LoraAdapterError(f"{folder} has no {WEIGHTS_FILE}{other}")
    config_bytes = config_path.read_bytes()
    try:
        peft = json.loads(config_bytes)
    except ValueError as exc:
        raise LoraAdapterError(f"{folder}: cannot read {CONFIG_FILE}: {exc}") from exc
    if not isinstance(peft, dict):
        raise LoraAdapterError(f"{folder}/{CONFIG_FILE} is not a JSON object")
    rank, scaling = _rank_and_scaling(peft, max_rank, folder)
    weights_bytes = weights_path.read_bytes()
    try:
        tensors = load_safetensors(weights_bytes)
    except Exception as exc:  # safetensors says what is wrong with the file
        raise LoraAdapterError(f"{folder}: cannot read the adapter: {exc}") from exc
    raw = _collect(tensors, folder)
    pairs = _checked_pairs(raw, config, rank, folder)
    digest = hashlib.sha256(config_bytes + b"\x00" + weights_bytes).hexdigest()
    scaled = {key: (a.float().contiguous(), (b.float() * scaling).contiguous())
              for key, (a, b) in pairs.items()}
    targets = tuple(t for t in LORA_TARGETS if any(k[1] == t for k in scaled))
    return LoraWeights(rank, scaling, targets, scaled, digest)


def _rank_and_scaling(peft: dict[str, Any], max_rank: int, folder: Path) -> tuple[int, float]:
    kind = peft.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise LoraAdapterError(f"{folder}: a {kind} adapter; only LoRA adapters are served")
    for key, what in _UNSUPPORTED.items():
        if peft.get(key):
            raise LoraAdapterError(f"{folder}: the adapter uses {what}, which is not served")
    if peft.get("bias", "none") != "none":
        raise LoraAdapterError(f"{folder}: the adapter trains biases (bias="
                               f"{peft['bias']!r}), which are not served")
    rank, alpha = peft.get("r"), peft.get("lora_alpha", 8)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise LoraAdapterError(f"{folder}: 'r' must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise LoraAdapterError(f"{folder}: rank {rank} is over the engine's max_lora_rank "
                               f"({max_rank})")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(
            alpha):
        raise LoraAdapterError(f"{folder}: 'lora_alpha' must be a number, got {alpha!r}")
    scaling = alpha / math.sqrt(rank) if peft.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def _collect(tensors: dict[str, torch.Tensor], folder: Path
             ) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
    """The A and B of each (layer, target); any tensor outside the seven is refused."""
    raw: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = _TENSOR.match(name)
        if match is None or match.group(2) not in LORA_TARGETS:
            module = _module_of(name)
            raise LoraAdapterError(
                f"{folder}: the adapter changes {module!r}; only "
                f"{', '.join(LORA_TARGETS)} can be adapted (not embeddings or the LM head)")
        if not tensor.is_floating_point():
            raise LoraAdapterError(f"{folder}: {name} is not a float tensor")
        raw.setdefault((int(match.group(1)), match.group(2)), {})[match.group(3)] = tensor
    if not raw:
        raise LoraAdapterError(f"{folder}: the adapter holds no LoRA weights")
    return raw


def _module_of(name: str) -> str:
    """The adapted module a tensor belongs to: ``base_model.model.lm_head.lora_A.weight``
    -> ``lm_head``."""
    name = name.removeprefix("base_model.model.")
    for marker in (".lora_", ".base_layer."):
        if marker in name:
            return name[: name.index(marker)]
    return name.rsplit(".", 1)[0]


def _checked_pairs(raw: dict[tuple[int, str], dict[str, torch.Tensor]], config: ModelConfig,
                   rank: int, folder: Path
                   ) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """Each (layer, target)'s (A, B), both present and shaped for the base model."""
    places = target_places(config)
    pairs = {}
    for (layer, target), ab in sorted(raw.items()):
        where = f"layer {layer} {target}"
        if layer >= config.num_hidden_layers:
            raise LoraAdapterError(f"{folder}: {where}, but the base model has "
                                   f"{config.num_hidden_layers} layers")
        place = places[target]
        if place.linear not in adaptable_linears(config, layer):
            raise LoraAdapterError(f"{folder}: {where} is a mixture-of-experts MLP, "
                                   "whose experts cannot be adapted")
        if set(ab) != {"A", "B"}:
            raise LoraAdapterError(f"{folder}: {where} has lora_{''.join(ab)} alone")
        a, b = ab["A"], ab["B"]
        want_a, want_b = (rank, place.in_features), (place.out_features, rank)
        if tuple(a.shape) != want_a or tuple(b.shape) != want_b:
            raise LoraAdapterError(
                f"{folder}: {where} has A {tuple(a.shape)} and B {tuple(b.shape)}; the "
                f"base model takes A {want_a} and B {want_b} (an adapter of another model?)")
        pairs[(layer, target)] = (a, b)
    return pairs
