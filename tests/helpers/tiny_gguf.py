"""Write a GGUF file from a tiny Hugging Face model the way llama.cpp's converter does.

Independent of the reader under test: the q/k permutation and the Llama 3 ``rope_freqs``
tensor are computed here with llama.cpp's own (forward) formulas. The tokenizer is a tiny
byte-level BPE (256 byte tokens, three ChatML specials, three merges), so building it from
the metadata takes milliseconds instead of the seconds a 49k vocabulary costs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file
from transformers.convert_slow_tokenizer import bytes_to_unicode

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_BLOCK_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def tiny_vocab() -> tuple[list[str], list[int]]:
    """Tokens and llama.cpp token types (3 = control, 1 = normal) of the tiny tokenizer."""
    byte_tokens = list(bytes_to_unicode().values())
    merged = ["".join(m.split(" ")) for m in MERGES]
    tokens = SPECIAL_TOKENS + byte_tokens + merged
    types = [3] * len(SPECIAL_TOKENS) + [1] * (len(byte_tokens) + len(merged))
    return tokens, types


TINY_VOCAB_SIZE = len(tiny_vocab()[0])


def llama_cpp_permute(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's ``LlamaModel.permute``: interleave each head's rotary halves."""
    return (
        weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def llama3_rope_freqs(scaling: dict, base: float, head_dim: int) -> np.ndarray:
    """llama.cpp's ``rope_freqs`` tensor for Llama 3 rope scaling (per-frequency divisors)."""
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (base ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            out.append(1.0)
        elif wavelen > old_len / low:
            out.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def write_gguf_from_hf(
    hf_folder: Path,
    dest: Path,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    architecture: str | None = None,
    encode: Callable[[str, np.ndarray], tuple[np.ndarray, gguf.GGMLQuantizationType] | None]
    | None = None,
) -> Path:
    """Convert ``hf_folder`` (a tiny model built with the tiny vocabulary) into ``dest``.

    2-D weights are stored as ``qtype``; norms and biases stay F32 as llama.cpp keeps them.
    ``encode(gguf name, float values)`` may instead give a 2-D tensor's stored bytes and
    type (types ``gguf.quants.quantize`` cannot make), or None for the default.
    """
    config = json.loads((hf_folder / "config.json").read_text())
    arch = architecture or {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[
        config["model_type"]]
    state = load_file(str(hf_folder / "model.safetensors"))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    tokens, types = tiny_vocab()
    assert config["vocab_size"] == len(tokens), "build the model with vocab_size=TINY_VOCAB_SIZE"

    writer = gguf.GGUFWriter(str(dest), arch)
    writer.add_name("tiny test model")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    rope = config.get("rope_parameters") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    writer.add_rope_freq_base(theta)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)

    if rope.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_freqs(rope, theta, head_dim))
    for hf_name, tensor in state.items():
        tensor = tensor.to(torch.float32)
        if arch == "llama" and ".self_attn.q_proj." in hf_name:
            tensor = llama_cpp_permute(tensor, heads)
        elif arch == "llama" and ".self_attn.k_proj." in hf_name:
            tensor = llama_cpp_permute(tensor, kv_heads)
        array = tensor.numpy()
        encoded = encode(_gguf_name(hf_name), array) if encode and array.ndim == 2 else None
        if encoded is not None:
            writer.add_tensor(_gguf_name(hf_name), encoded[0], raw_dtype=encoded[1])
        elif array.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(
                _gguf_name(hf_name), gguf.quants.quantize(array, qtype), raw_dtype=qtype
            )
        else:
            writer.add_tensor(_gguf_name(hf_name), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def _gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_BLOCK_NAMES[module]}.{kind}"
