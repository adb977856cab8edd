"""Tiny random-weight Hugging Face models, written to a folder like a real checkpoint.

Each configuration exercises one shape the decoder must get right (MHA, GQA with q/k/v
bias and tied embeddings, MQA, Llama 3 rope scaling), and one per further family (Qwen3's
q/k norms, Phi-3's fused checkpoint, Gemma 2's soft-capping and alternating windows,
Gemma 3's local/global RoPE, Mistral's window on every layer, Mixtral's and Qwen3-MoE's
experts). Windows are a few dozen tokens, so the parity prompts run far past them. ``initializer_range`` is large (0.2)
and norms and biases are randomised too, so logits are well separated: tiny models with
the default 0.02 init produce near-ties that make greedy comparisons flaky, and zero
biases would leave the bias path untested. Everything is seeded, so a name always builds
the same weights.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

# arch -> (config class, model class)
ARCHITECTURES: dict[str, tuple[type[PretrainedConfig], type[PreTrainedModel]]] = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "phi3": (Phi3Config, Phi3ForCausalLM),
    "gemma2": (Gemma2Config, Gemma2ForCausalLM),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "mixtral": (MixtralConfig, MixtralForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
}

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
    # Qwen3: RMSNorm on every head's q and k before RoPE.
    "qwen3-qk-norm": {
        "arch": "qwen3",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 512,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
    },
    # Phi-3: the checkpoint stores qkv_proj and gate_up_proj already fused.
    "phi3-fused": {
        "arch": "phi3",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 512,
        "tie_word_embeddings": False,
    },
    # Gemma 2: sandwich norms, GELU, both soft-caps, even layers windowed to 40 tokens.
    # Untied embeddings and a low attention cap: with Gemma's scaled tied embeddings a
    # tiny model's argmax is the input token's own row whatever attention does, and a cap
    # of 50 never bends this model's scores, so greedy parity could not catch a bug there.
    "gemma2-softcap-window": {
        "arch": "gemma2",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 4,
        "intermediate_size": 512,
        "tie_word_embeddings": False,
        "query_pre_attn_scalar": 64,
        "sliding_window": 40,
        "attn_logit_softcapping": 5.0,
        "final_logit_softcapping": 30.0,
    },
    # Gemma 3: q/k norms; windowed layers rotate with their own base, the global one
    # with linear scaling (embeddings untied, as for Gemma 2).
    "gemma3-local-global": {
        "arch": "gemma3",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "num_hidden_layers": 3,
        "intermediate_size": 512,
        "tie_word_embeddings": False,
        "query_pre_attn_scalar": 64,
        "sliding_window": 36,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    },
    # Mistral with a 32-token window on every layer: blocks behind it can be freed.
    "mistral-window": {
        "arch": "mistral",
        "hidden_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 2,
        "intermediate_size": 256,
        "tie_word_embeddings": False,
        "sliding_window": 32,
    },
    # Mixtral: 4 experts, top 2, renormalised.
    "mixtral-moe": {
        "arch": "mixtral",
        "hidden_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 2,
        "intermediate_size": 256,
        "tie_word_embeddings": False,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    # Qwen3-MoE: 8 experts, top 2, not renormalised; layer 0 keeps a dense MLP.
    "qwen3-moe": {
        "arch": "qwen3_moe",
        "hidden_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 2,
        "intermediate_size": 256,
        "moe_intermediate_size": 128,
        "tie_word_embeddings": True,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": False,
        "mlp_only_layers": [0],
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
) -> PretrainedConfig:
    """The transformers config of a tiny model (head_dim 64, float32, init std 0.2)."""
    spec = copy.deepcopy(TINY_MODELS[name])  # transformers' configs mutate dicts they get
    arch = spec.pop("arch")
    if "rope_parameters" not in spec:
        spec["rope_theta"] = spec.get("rope_theta", 10000.0)
    kwargs: dict[str, Any] = {
        **spec,
        **SPECIAL_IDS,
        "vocab_size": vocab_size,
        "head_dim": 64,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.2,
        **overrides,
    }
    if arch == "qwen2":
        kwargs.pop("head_dim")  # Qwen2 derives it: hidden / heads = 64
        kwargs["use_sliding_window"] = False
    if arch == "phi3":
        kwargs.pop("head_dim")  # Phi-3 derives it too
    if arch in ("mistral", "mixtral"):
        kwargs.setdefault("sliding_window", None)
    config_class = ARCHITECTURES[arch][0]
    return config_class(**kwargs)


def build_tiny_hf_model(
    name: str, vocab_size: int = SMOLLM2_VOCAB_SIZE, seed: int = 0, **overrides: Any
) -> PreTrainedModel:
    """The model in memory, deterministic for ``(name, vocab_size, seed, overrides)``."""
    config = tiny_hf_config(name, vocab_size, **overrides)
    torch.manual_seed(seed)
    model_class = ARCHITECTURES[TINY_MODELS[name]["arch"]][1]
    model = model_class(config).to(torch.float32).eval()
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
    **overrides: Any,
) -> Path:
    """Write tiny model ``name`` to ``folder`` as a Hugging Face checkpoint (safetensors).

    With ``tokenizer_folder`` (normally the prepared SmolLM2 cache folder, whose vocabulary
    is 49152 like the model's) its tokenizer files are copied in, so the folder is a
    complete model that ``AutoTokenizer`` and our loader both read.
    """
    folder.mkdir(parents=True, exist_ok=True)
    build_tiny_hf_model(name, vocab_size, seed, **overrides).save_pretrained(folder)
    if tokenizer_folder is not None:
        for file_name in TOKENIZER_FILES:
            source = tokenizer_folder / file_name
            if source.is_file():
                shutil.copyfile(source, folder / file_name)
    return folder
