"""Read a GGUF file (llama.cpp's format) as a ModelConfig and float32 tensors under HF names.

Facts about the format that this module undoes (learnt from llama.cpp's converter and
transformers' GGUF loader):

- Shapes are stored fastest-dimension first, the reverse of torch's order.
- For architecture ``llama`` the converter permutes the rows of q/k (weights and biases)
  so each head's rotary pairs sit side by side (GPT-J style rotation); Hugging Face
  rotates halves. ``qwen2`` and ``qwen3`` files are written unpermuted (llama.cpp runs
  them NEOX style).
- Llama 3.1/3.2 and Phi-3 keep rope scaling in tensors (``gguf_rope``).
- Tied embeddings are implied by the absence of ``output.weight``.
- Each architecture's tensor names, norm offset and config keys: ``gguf_architectures``
  (Gemma's norms are stored plus one; MoE experts stacked, split here per expert).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from kvrelay_worker.loading.gguf_architectures import ARCHITECTURES, GGUFArchitecture
from kvrelay_worker.loading.gguf_metadata import GGUFFile, GGUFTensorInfo
from kvrelay_worker.loading.gguf_rope import ROPE_TENSORS, float32_value, rope_scaling
from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.models.model_config import ModelConfig

SUPPORTED_GGUF_ARCHITECTURES = tuple(ARCHITECTURES)

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Tensors that carry no weight of the HF model: consumed into the config or obsolete.
_IGNORED_BLOCK_TENSORS = {"attn_rot_embd"}


@dataclass(frozen=True)
class GGUFTensorSpec:
    """One weight of the HF model: its name, torch shape, and where it lies in the file."""

    name: str
    shape: tuple[int, ...]
    gguf_name: str
    gguf_type: str
    expert: int | None = None  # this expert's slice of a stacked MoE tensor


class GGUFCheckpoint:
    """An open GGUF file: its parsed header (``GGUFFile``), config, and weights on demand."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.reader = GGUFFile(self.path)
        except (ValueError, OSError) as exc:
            raise UnsupportedModelError(f"{self.path} is not a readable GGUF file: {exc}") from exc
        self._tensors = {t.name: t for t in self.reader.tensors}
        self.architecture = str(self.metadata("general.architecture", ""))
        if self.architecture not in ARCHITECTURES:
            raise UnsupportedModelError(
                f"{self.path}: GGUF architecture {self.architecture!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)})"
            )
        self.arch: GGUFArchitecture = ARCHITECTURES[self.architecture]
        self._specs = self._tensor_specs()
        self._check_dequantizable()
        self.config = self._read_config()

    def metadata(self, key: str, default: Any = None) -> Any:
        """A metadata value as a Python scalar, str, or list (``default`` when absent)."""
        return self.reader.value(key, default)

    @property
    def chat_template(self) -> str | None:
        """The chat template the file carries (``tokenizer.chat_template``), if any."""
        template = self.metadata("tokenizer.chat_template")
        return str(template) if template else None

    def tensor_specs(self) -> list[GGUFTensorSpec]:
        """Every HF weight this file yields, in file order, without dequantising anything."""
        return list(self._specs)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, float32 tensor)`` one at a time, dequantised and un-permuted."""
        for spec in self._specs:
            yield spec.name, self.load_tensor(spec)

    def load_tensor(self, spec: GGUFTensorSpec) -> torch.Tensor:
        """Dequantise one weight to float32 in torch layout (HF rotate-half order for q/k,
        HF's norm values, one expert of a stacked tensor)."""
        tensor = self._tensors[spec.gguf_name]
        data = tensor.data if spec.expert is None else tensor.slab(spec.expert)
        array = _dequantize_data(data, tensor.tensor_type).reshape(spec.shape)
        out = torch.from_numpy(np.require(array, dtype=np.float32, requirements=["C", "W"]))
        if self.arch.norm_offset and spec.name.endswith("norm.weight"):
            out -= self.arch.norm_offset
        if self.arch.permuted_qk:
            if ".self_attn.q_proj." in spec.name:
                out = _unpermute_rotary_rows(out, self.config.num_attention_heads)
            elif ".self_attn.k_proj." in spec.name:
                out = _unpermute_rotary_rows(out, self.config.num_key_value_heads)
        return out

    def raw_tensor(self, spec: GGUFTensorSpec) -> GGUFTensorInfo:
        """The file's tensor (its quantized blocks as stored, read when ``data`` is asked)."""
        return self._tensors[spec.gguf_name]

    def rotary_row_order(self, spec: GGUFTensorSpec) -> torch.Tensor | None:
        """Row indices that undo llama.cpp's q/k permutation (None: rows are in order)."""
        if not self.arch.permuted_qk:
            return None
        if ".self_attn.q_proj." in spec.name:
            heads = self.config.num_attention_heads
        elif ".self_attn.k_proj." in spec.name:
            heads = self.config.num_key_value_heads
        else:
            return None
        rows = torch.arange(spec.shape[0])[:, None]
        return _unpermute_rotary_rows(rows, heads)[:, 0]

    def _key(self, suffix: str) -> str:
        return f"{self.architecture}.{suffix}"

    def _tensor_specs(self) -> list[GGUFTensorSpec]:
        specs = []
        unknown = []
        for tensor in self.reader.tensors:
            shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
            kind = tensor.tensor_type.name
            match = _BLOCK_NAME.fullmatch(tensor.name)
            if match is not None and match.group(2) in self.arch.expert_tensors:
                layer, part, _ = match.groups()
                module = self.arch.expert_tensors[part]
                for expert in range(shape[0]):
                    name = f"model.layers.{layer}.{module.format(e=expert)}.weight"
                    specs.append(GGUFTensorSpec(name, shape[1:], tensor.name, kind, expert))
                continue
            hf_name = self._hf_name(tensor.name)
            if hf_name is not None:
                specs.append(GGUFTensorSpec(hf_name, shape, tensor.name, kind))
            elif not _is_ignored(tensor.name):
                unknown.append(tensor.name)
        if unknown:
            raise UnsupportedModelError(
                f"{self.path}: tensors with no {self.architecture} counterpart here: "
                f"{unknown[:5]}"
            )
        return specs

    def _hf_name(self, gguf_name: str) -> str | None:
        if gguf_name in _GLOBAL_TENSORS:
            return _GLOBAL_TENSORS[gguf_name]
        match = _BLOCK_NAME.fullmatch(gguf_name)
        if match is None or match.group(2) not in self.arch.block_tensors:
            return None
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{self.arch.block_tensors[part]}.{kind}"

    def _check_dequantizable(self) -> None:
        """Fail before a long conversion if some tensor type cannot be dequantised."""
        checked: set[GGMLQuantizationType] = set()
        for tensor in self.reader.tensors:
            if tensor.tensor_type in checked:
                continue
            checked.add(tensor.tensor_type)
            try:
                dequantize(tensor.first_row(), tensor.tensor_type)
            except NotImplementedError as exc:
                raise UnsupportedModelError(
                    f"{self.path}: tensor {tensor.name} has type {tensor.tensor_type.name}, "
                    f"which the gguf package cannot dequantise"
                ) from exc

    def _read_config(self) -> ModelConfig:
        path = self.path
        hidden = self._required_int("embedding_length")
        heads = self._required_int("attention.head_count")
        kv_heads = _single_value(
            self.metadata(self._key("attention.head_count_kv"), heads), "head_count_kv", path
        )
        head_dim = int(self.metadata(self._key("attention.key_length"), hidden // heads))
        value_dim = int(self.metadata(self._key("attention.value_length"), head_dim))
        rope_dim = int(self.metadata(self._key("rope.dimension_count"), head_dim))
        if value_dim != head_dim or rope_dim != head_dim:
            raise UnsupportedModelError(
                f"{path}: head sizes k={head_dim} v={value_dim} rope={rope_dim} differ; "
                "partial rotary and uneven heads are not supported"
            )
        max_positions = self._required_int("context_length")
        layers = self._required_int("block_count")
        fields = {} if self.arch.fields is None else self.arch.fields(
            self._meta, layers, hidden, head_dim, str(path))
        window = self._meta("attention.sliding_window", None)
        if "sliding_window" not in fields and window is not None and int(window) < max_positions:
            raise UnsupportedModelError(f"{path}: sliding-window attention is not supported")
        specs = {s.name: s for s in self._specs}
        vocab = specs["model.embed_tokens.weight"].shape[0]
        names = set(specs)
        q_bias = "model.layers.0.self_attn.q_proj.bias" in names
        o_bias = "model.layers.0.self_attn.o_proj.bias" in names
        mlp_bias = "model.layers.0.mlp.gate_proj.bias" in names
        if self.architecture == "qwen2":
            if not q_bias or o_bias or mlp_bias:
                raise UnsupportedModelError(
                    f"{path}: a qwen2 GGUF should bias q/k/v and nothing else"
                )
        elif q_bias != o_bias:
            raise UnsupportedModelError(
                f"{path}: Llama biases q/k/v and o together; this file biases only some of them"
            )
        theta = float32_value(self._meta("rope.freq_base", 10000.0))
        common: dict[str, Any] = {
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": self._required_int("feed_forward_length"),
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "rms_norm_eps": float32_value(self._meta("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": theta,
            "rope_scaling": rope_scaling(self._meta, self._tensors, theta, head_dim,
                                         max_positions, path),
            "max_position_embeddings": max_positions,
            "tie_word_embeddings": "lm_head.weight" not in names,
            "attention_bias": q_bias,
            "attention_output_bias": o_bias,
            "mlp_bias": mlp_bias,
            "bos_token_id": _optional_int(self.metadata("tokenizer.ggml.bos_token_id")),
            "eos_token_ids": self._eos_ids(),
            "pad_token_id": _optional_int(self.metadata("tokenizer.ggml.padding_token_id")),
            "model_type": self.architecture,
            "qk_norm": "model.layers.0.self_attn.q_norm.weight" in names,
            "extra": {
                "gguf_name": self.metadata("general.name"),
                "gguf_file_type": self.metadata("general.file_type"),
            },
        }
        common.update(fields)  # the family's own keys
        for name in ("local_rope_theta", "attn_logit_softcapping", "final_logit_softcapping"):
            if common.get(name) is not None:
                common[name] = float32_value(common[name])
        try:
            return ModelConfig(**common)
        except ValueError as exc:
            raise UnsupportedModelError(f"{path}: {exc}") from exc

    def _meta(self, suffix: str, default: Any) -> Any:
        """A value under this architecture's prefix (``<arch>.<suffix>``)."""
        return self.metadata(self._key(suffix), default)

    def _required_int(self, suffix: str) -> int:
        value = self.metadata(self._key(suffix))
        if value is None:
            raise UnsupportedModelError(f"{self.path}: metadata lacks {self._key(suffix)}")
        return _single_value(value, suffix, self.path)

    def _eos_ids(self) -> tuple[int, ...]:
        """eos, then end-of-turn and end-of-message ids (Llama 3 chat ends turns with eot)."""
        ids = [self.metadata(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
        return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def read_gguf_config(path: Path) -> ModelConfig:
    """The ModelConfig a GGUF file describes (reads only metadata and tensor headers)."""
    return GGUFCheckpoint(path).config


def _is_ignored(gguf_name: str) -> bool:
    if gguf_name in ROPE_TENSORS:
        return True
    match = _BLOCK_NAME.fullmatch(gguf_name)
    return match is not None and match.group(2) in _IGNORED_BLOCK_TENSORS


def _dequantize_data(data: np.ndarray, kind: GGMLQuantizationType) -> np.ndarray:
    """float32 values of a file's tensor (quantised data comes as rows of packed bytes)."""
    return np.asarray(dequantize(data, kind), dtype=np.float32)


def _unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation, restoring Hugging Face's rotate-half order.

    Within each head llama.cpp stores row ``2*i + j`` where HF has row ``j*half + i``
    (``i < half = head_dim/2``, ``j`` in {0, 1}); works on weights and biases alike.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    grouped = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return grouped.transpose(1, 2).reshape(weight.shape).contiguous()


def _single_value(value: Any, what: str, path: Path) -> int:
    """Per-layer arrays are fine while all layers agree."""
    if isinstance(value, list):
        if not value or len(set(value)) != 1:
            raise UnsupportedModelError(f"{path}: per-layer {what} values differ: {value[:8]}")
        value = value[0]
    return int(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
