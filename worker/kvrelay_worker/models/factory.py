"""Build a decoder on its device and dtype without materialising throwaway weights."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from kvrelay_worker.freed_memory import give_back_freed_memory
from kvrelay_worker.models.allocate import allocate
from kvrelay_worker.models.decoder import CausalLM
from kvrelay_worker.models.families import FAMILIES, family_of
from kvrelay_worker.models.model_config import ModelConfig
from kvrelay_worker.models.quantize_model import quantize_model, quantize_part

SUPPORTED_MODEL_TYPES = tuple(family.name for family in FAMILIES)


def build_model(config: ModelConfig, weights: Iterable[tuple[str, torch.Tensor]] | None,
                dtype: torch.dtype, device: torch.device, max_position: int,
                random_init_std: float = 0.02, seed: int = 0, quantization: str = "none",
                group_size: int = 32, weights_owned: bool = False) -> CausalLM:
    """Create the model on ``meta``, then give it storage on ``device`` and fill it.

    With ``weights`` each parameter gets its storage as its first tensor arrives, and with
    ``quantization`` (``int8``/``int4``) each part is quantized as soon as it is loaded: the
    float weights of one part at a time are resident, never the whole float model.
    ``weights_owned``: the tensors are fresh reads nobody else holds, so one already in the
    model's dtype becomes its parameter without a copy (``CausalLM.load_weights``). With
    ``None`` parameters are random normal (benchmarks at a real model's shape need no
    checkpoint).
    """
    family_of(config.model_type)  # refuses an unknown family with the supported list
    with torch.device("meta"):
        model = CausalLM(config, max_position=max_position)
    model.place_rotary_tables(device)
    if weights is None:
        model = allocate(model, device, dtype)
        if config.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        _fill_random(model, random_init_std, seed, device)
        if quantization != "none":
            quantize_model(model, quantization, group_size)
        return model.eval()

    def part_loaded(part: str) -> None:
        if quantization != "none":
            quantize_part(model, part, quantization, group_size)
        give_back_freed_memory()

    model.load_weights(weights, place=(device, dtype), on_part_loaded=part_loaded,
                       adopt=weights_owned)
    return model.eval()


def _fill_random(model: CausalLM, std: float, seed: int, device: torch.device) -> None:
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, std, generator=generator)
