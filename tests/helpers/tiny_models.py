"""Tiny random-weight Hugging Face models, written to a folder like a real checkpoint.

Each configuration exercises one shape the decoder must get right (MHA, GQA with q/k/v
bias and tied embeddings, MQA, Llama 3 rope scaling). ``initializer_range`` is large (0.2)
and norms and biases are randomised too, so logits are well separated: tiny models with
the default 0.02 init produce near-ties that make greedy comparisons flaky, and zero
biases would leave the bias path untested. Everything is seeded, so a name always builds
the same weights.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

# SmolLM2's tokenizer: 49152 tokens; <|endoftext|> = 0, <|im_start|> = 1, <|im_end|> = 2.
SMOLLM2_VOCAB_SIZE = 49152
SPECIAL_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}

TINY_MODELS: dict[str, dict[str, Any]] = {
    # Llama, one kv head per query head, separate lm_head.
    "llama-mha-untied": {
        "arch": "llama",
        "hidden_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 256,
        "tie_word_embeddings": False,
    },
    # Qwen2: grouped-query attention (4 heads share 2 kv heads), q/k/v bias, tied lm_head.
    "qwen2-gqa-bias-tied": {
        "arch": "qwen2",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 512,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
    },
    # Llama, multi-query attention (a single kv head), three layers.
    "llama-mqa": {
        "arch": "llama",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "num_hidden_layers": 3,
        "intermediate_size": 384,
        "tie_word_embeddings": True,
    },
    # Llama 3 rope scaling with a 64-token original context, so most frequencies are
    # stretched or blended and a wrong implementation shows at short positions.
    "llama3-rope": {
        "arch": "llama",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 512,
        "tie_word_embeddings": False,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
}
TINY_MODEL_NAMES = tuple(TINY_MODELS)

# The files ``save_pretrained`` writes for a tokenizer (whichever exist get copied).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def tiny_hf_config(
    name: str, vocab_size: int = SMOLLM2_VOCAB_SIZE, **overrides: Any
) -> LlamaConfig | Qwen2Config:
    """The transformers config of a tiny model (head_dim 64, float32, init std 0.2)."""
    spec = dict(TINY_MODELS[name])
    arch = spec.pop("arch")
    rope_theta = spec.pop("rope_theta", 10000.0)
    rope_scaling = spec.pop("rope_scaling", None)
    kwargs: dict[str, Any] = {
        **spec,
        **SPECIAL_IDS,
        "vocab_size": vocab_size,
        "head_dim": 64,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.2,
        "rope_theta": rope_theta,
        **overrides,
    }
    if rope_scaling is not None:
        kwargs["rope_scaling"] = dict(rope_scaling)
    if arch == "qwen2":
        kwargs.pop("head_dim")  # Qwen2 derives it: hidden / heads = 64
        return Qwen2Config(use_sliding_window=False, **kwargs)
    return LlamaConfig(**kwargs)


def build_tiny_hf_model(
    name: str, vocab_size: int = SMOLLM2_VOCAB_SIZE, seed: int = 0
) -> PreTrainedModel:
    """The model in memory, deterministic for ``(name, vocab_size, seed)``."""
    config = tiny_hf_config(name, vocab_size)
    torch.manual_seed(seed)
    model_cls = Qwen2ForCausalLM if config.model_type == "qwen2" else LlamaForCausalLM
    model = model_cls(config).to(torch.float32).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            elif param_name.endswith(".bias"):
                param.copy_(0.2 * torch.randn(param.shape, generator=generator))
    return model


def build_tiny_model(
    name: str,
    folder: Path,
    tokenizer_folder: Path | None = None,
    vocab_size: int = SMOLLM2_VOCAB_SIZE,
    seed: int = 0,
) -> Path:
    """Write tiny model ``name`` to ``folder`` as a Hugging Face checkpoint (safetensors).

    With ``tokenizer_folder`` (normally the prepared SmolLM2 cache folder, whose vocabulary
    is 49152 like the model's) its tokenizer files are copied in, so the folder is a
    complete model that ``AutoTokenizer`` and our loader both read.
    """
    folder.mkdir(parents=True, exist_ok=True)
    build_tiny_hf_model(name, vocab_size, seed).save_pretrained(folder)
    if tokenizer_folder is not None:
        for file_name in TOKENIZER_FILES:
            source = tokenizer_folder / file_name
            if source.is_file():
                shutil.copyfile(source, folder / file_name)
    return folder
