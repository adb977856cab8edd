"""Build a decoder on its device and dtype without materialising throwaway weights."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.models.llama import LlamaForCausalLM
from kvrelay_worker.models.model_config import ModelConfig
from kvrelay_worker.models.rotary import build_cos_sin_cache

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def build_model(config: ModelConfig, weights: Iterable[tuple[str, torch.Tensor]] | None,
                dtype: torch.dtype, device: torch.device, max_position: int,
                random_init_std: float = 0.02, seed: int = 0) -> LlamaForCausalLM:
    """Create the model on ``meta``, allocate it on ``device``, then fill it.

    With ``weights`` the checkpoint fills every parameter; with ``None`` parameters are
    random normal (benchmarks at a real model's shape need no checkpoint).
    """
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model type {config.model_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    with torch.device("meta"):
        model = LlamaForCausalLM(config, max_position=max_position)
    model = model.to_empty(device=device).to(dtype)
    model.set_rotary_cache(build_cos_sin_cache(
        config.head_dim, config.rope_theta, config.rope_scaling, max_position, device
    ))
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
