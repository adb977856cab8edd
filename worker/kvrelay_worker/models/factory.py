"""Build a decoder on its device and dtype without materialising throwaway weights."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from kvrelay_worker.models.allocate import allocate
from kvrelay_worker.models.decoder import CausalLM
from kvrelay_worker.models.families import FAMILIES, family_of
from kvrelay_worker.models.model_config import ModelConfig

SUPPORTED_MODEL_TYPES = tuple(family.name for family in FAMILIES)


def build_model(config: ModelConfig, weights: Iterable[tuple[str, torch.Tensor]] | None,
                dtype: torch.dtype, device: torch.device, max_position: int,
                random_init_std: float = 0.02, seed: int = 0) -> CausalLM:
    """Create the model on ``meta``, allocate it on ``device``, then fill it.

    With ``weights`` the checkpoint fills every parameter; with ``None`` parameters are
    random normal (benchmarks at a real model's shape need no checkpoint).
    """
    family_of(config.model_type)  # refuses an unknown family with the supported list
    with torch.device("meta"):
        model = CausalLM(config, max_position=max_position)
    model = allocate(model, device, dtype)
    model.place_rotary_tables(device)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    if weights is None:
        generator = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.fill_(1.0)
                elif name.endswith("bias"):
                    param.zero_()
                else:
                    param.normal_(0.0, random_init_std, generator=generator)
    else:
        model.load_weights(weights)
    return model.eval()
