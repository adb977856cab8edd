"""A tiny random-weight Llama with SmolLM2's tokenizer, for benchmarks that measure
everything but the model (client fan-out, queue overheads)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "chat_template.jinja")


# The tiny model's shape: 2 layers, 128 wide (the model costs next to nothing).
TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
    "max_position_embeddings": 2048, "initializer_range": 0.2}


def make_random_llama(folder: Path, shape: dict[str, Any], seed: int = 0) -> Path:
    """Write (once) a random-weight Llama of ``shape`` with SmolLM2's vocabulary and
    tokenizer into ``folder``."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvrelay_worker.loading import prepare_model

    smollm2 = prepare_model("smollm2-135m-instruct", progress=False)
    config = LlamaConfig(vocab_size=49152, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                         **shape)
    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    for name in _TOKENIZER_FILES:
        if (smollm2 / name).is_file():
            shutil.copyfile(smollm2 / name, folder / name)
    return folder


def make_tiny_model(folder: Path, seed: int = 0) -> Path:
    """Write (once) the 2-layer, 128-wide Llama (``TINY_SHAPE``) into ``folder``."""
    return make_random_llama(folder, TINY_SHAPE, seed)
