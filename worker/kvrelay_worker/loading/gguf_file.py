"""Read a GGUF file (llama.cpp's format) as a ModelConfig and float32 tensors under HF names.

Facts about the format that this module undoes (learnt from llama.cpp's converter and
transformers' GGUF loader):

- Shapes are stored fastest-dimension first, the reverse of torch's order.
- For architecture ``llama`` the converter permutes the rows of q/k (weights and biases)
  so each head's rotary pairs sit side by side (GPT-J style rotation); Hugging Face
  rotates halves. ``qwen2`` and ``qwen3`` files are written unpermuted (llama.cpp runs
  them NEOX style).
- Llama 3.1/3.2 rope scaling is not stored as metadata but as a ``rope_freqs`` tensor of
  per-frequency divisors; we recover Hugging Face's ``llama3`` parameters from it.
- Tied embeddings are implied by the absence of ``output.weight``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from kvrelay_worker.loading.gguf_metadata import GGUFFile, GGUFTensorInfo
from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.models.model_config import ModelConfig

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3's per-head q/k RMSNorm
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Tensors that carry no weight of the HF model: consumed into the config or obsolete.
_ROPE_FREQS = "rope_freqs.weight"
_IGNORED_BLOCK_TENSORS = {"attn_rot_embd"}


@dataclass(frozen=True)
class GGUFTensorSpec:
    """One weight of the HF model: its name, torch shape, and where it lies in the file."""

    name: str
    shape: tuple[int, ...]
    gguf_name: str
    gguf_type: str


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
        if self.architecture not in SUPPORTED_GGUF_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{self.path}: GGUF architecture {self.architecture!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)})"
            )
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
        """Dequantise one weight to float32 in torch layout (HF rotate-half order for q/k)."""
        tensor = self._tensors[spec.gguf_name]
        array = _dequantize(tensor).reshape(spec.shape)
        out = torch.from_numpy(np.require(array, dtype=np.float32, requirements=["C", "W"]))
        if self.architecture == "llama":
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
        if self.architecture != "llama":
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
        for tensor in self.reader.tensors:
            hf_name = _hf_name(tensor.name)
            if hf_name is None:
                continue
            shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
            specs.append(GGUFTensorSpec(hf_name, shape, tensor.name, tensor.tensor_type.name))
        unknown = [
            t.name
            for t in self.reader.tensors
            if _hf_name(t.name) is None and not _is_ignored(t.name)
        ]
        if unknown:
            raise UnsupportedModelError(
                f"{self.path}: tensors with no Llama-family counterpart (fused or MoE layers?): "
                f"{unknown[:5]}"
            )
        return specs

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
        window = self.metadata(self._key("attention.sliding_window"))
        if window is not None and int(window) < max_positions:
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
        theta = _float32_value(self.metadata(self._key("rope.freq_base"), 10000.0))
        return ModelConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=self._required_int("feed_forward_length"),
            num_hidden_layers=self._required_int("block_count"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_float32_value(
                self.metadata(self._key("attention.layer_norm_rms_epsilon"), 1e-6)
            ),
            rope_theta=theta,
            rope_scaling=self._rope_scaling(theta, head_dim),
            max_position_embeddings=max_positions,
            tie_word_embeddings="lm_head.weight" not in names,
            attention_bias=q_bias,
            attention_output_bias=o_bias,
            mlp_bias=mlp_bias,
            bos_token_id=_optional_int(self.metadata("tokenizer.ggml.bos_token_id")),
            eos_token_ids=self._eos_ids(),
            pad_token_id=_optional_int(self.metadata("tokenizer.ggml.padding_token_id")),
            model_type=self.architecture,
            qk_norm="model.layers.0.self_attn.q_norm.weight" in names,
            extra={
                "gguf_name": self.metadata("general.name"),
                "gguf_file_type": self.metadata("general.file_type"),
            },
        )

    def _required_int(self, suffix: str) -> int:
        value = self.metadata(self._key(suffix))
        if value is None:
            raise UnsupportedModelError(f"{self.path}: metadata lacks {self._key(suffix)}")
        return _single_value(value, suffix, self.path)

    def _eos_ids(self) -> tuple[int, ...]:
        """eos, then end-of-turn and end-of-message ids (Llama 3 chat ends turns with eot)."""
        ids = [self.metadata(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
        return tuple(dict.fromkeys(int(i) for i in ids if i is not None))

    def _rope_scaling(self, theta: float, head_dim: int) -> dict[str, Any] | None:
        kind = self.metadata(self._key("rope.scaling.type"))
        factor = self.metadata(self._key("rope.scaling.factor"))
        if kind is None and self.metadata(self._key("rope.scale_linear")) is not None:
            kind, factor = "linear", self.metadata(self._key("rope.scale_linear"))
        freqs = self._tensors.get(_ROPE_FREQS)
        if freqs is not None:
            if kind not in (None, "none"):
                raise UnsupportedModelError(
                    f"{self.path}: rope_freqs together with {kind} rope scaling is not supported"
                )
            divisors = _dequantize(freqs).reshape(-1).astype(np.float64)
            return _llama3_rope_from_divisors(
                divisors,
                theta,
                head_dim,
                self.metadata(self._key("rope.scaling.original_context_length")),
                self.path,
            )
        if kind in (None, "none"):
            return None
        if kind == "linear":
            return {"rope_type": "linear", "factor": _float32_value(factor)}
        if kind == "yarn":
            original = self.metadata(self._key("rope.scaling.original_context_length"))
            if original is None:
                raise UnsupportedModelError(
                    f"{self.path}: yarn scaling without its original length"
                )
            return {
                "rope_type": "yarn",
                "factor": _float32_value(factor),
                "original_max_position_embeddings": int(original),
            }
        raise UnsupportedModelError(f"{self.path}: rope scaling type {kind!r} is not supported")


def read_gguf_config(path: Path) -> ModelConfig:
    """The ModelConfig a GGUF file describes (reads only metadata and tensor headers)."""
    return GGUFCheckpoint(path).config


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _BLOCK_NAME.fullmatch(gguf_name)
    if match is None or match.group(2) not in _BLOCK_TENSORS:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK_TENSORS[part]}.{kind}"


def _is_ignored(gguf_name: str) -> bool:
    if gguf_name == _ROPE_FREQS:
        return True
    match = _BLOCK_NAME.fullmatch(gguf_name)
    return match is not None and match.group(2) in _IGNORED_BLOCK_TENSORS


def _dequantize(tensor: GGUFTensorInfo) -> np.ndarray:
    """float32 values of a file's tensor (quantised data comes as rows of packed bytes)."""
    return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)


def _unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation, restoring Hugging Face's rotate-half order.

    Within each head llama.cpp stores row ``2*i + j`` where HF has row ``j*half + i``
    (``i < half = head_dim/2``, ``j`` in {0, 1}); works on weights and biases alike.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    grouped = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return grouped.transpose(1, 2).reshape(weight.shape).contiguous()


def _llama3_rope_from_divisors(
    divisors: np.ndarray,
    theta: float,
    head_dim: int,
    original_hint: Any,
    path: Path,
) -> dict[str, Any] | None:
    """Recover HF's ``llama3`` rope parameters from llama.cpp's per-frequency divisors.

    Llama 3 scaling leaves short wavelengths alone, divides long ones by ``factor`` and
    blends in between with ``s = (orig/wavelen - low) / (high - low)``, i.e. s is linear in
    ``1/wavelen``. Only the two ratios ``orig/(high-low)`` and ``low/(high-low)`` are
    observable, so we fix ``low_freq_factor = 1`` (Meta's value; any choice with the same
    ratios gives identical frequencies) and solve for the rest, then check by recomputing.
    """
    expected_len = head_dim // 2
    if divisors.shape != (expected_len,):
        raise UnsupportedModelError(
            f"{path}: rope_freqs has {divisors.size} values, not {expected_len}"
        )
    factor = float(divisors.max())
    if np.allclose(divisors, 1.0):
        return None
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    wavelen = 2 * math.pi / inv_freq
    candidates: list[tuple[float, float]] = []  # (high_freq_factor, original length)
    blend = (divisors > 1.0 + 1e-4) & (divisors < factor * (1 - 1e-4))
    if blend.sum() >= 2 and factor > 1.0:
        # 1/divisor = (1-s)/factor + s  =>  s = (1/divisor - 1/factor) / (1 - 1/factor)
        s = (1.0 / divisors[blend] - 1.0 / factor) / (1.0 - 1.0 / factor)
        slope, intercept = np.polyfit(1.0 / wavelen[blend], s, 1)
        if intercept < 0:
            span = -1.0 / intercept  # high - low, with low = 1
            candidates.append((round(1.0 + span, 4), float(slope) * span))
    candidates += [(4.0, float(original)) for original in (original_hint, 8192) if original]
    for high, original in candidates:
        original_int = round(original)
        if original_int <= 0 or high <= 1.0:
            continue
        rebuilt = _llama3_divisors(wavelen, factor, 1.0, high, original_int)
        if np.allclose(rebuilt, divisors, rtol=1e-4, atol=1e-6):
            return {
                "rope_type": "llama3",
                "factor": _float32_value(factor),
                "low_freq_factor": 1.0,
                "high_freq_factor": high,
                "original_max_position_embeddings": original_int,
            }
    raise UnsupportedModelError(
        f"{path}: rope_freqs does not match Llama 3 rope scaling; cannot express it for "
        "Hugging Face"
    )


def _llama3_divisors(
    wavelen: np.ndarray, factor: float, low: float, high: float, original: int
) -> np.ndarray:
    """llama.cpp's rope_freqs for Llama 3 scaling (the quantity HF divides inv_freq by)."""
    smooth = (original / wavelen - low) / (high - low)
    blended = 1.0 / ((1.0 - smooth) / factor + smooth)
    out = np.where(wavelen > original / low, factor, blended)
    return np.where(wavelen < original / high, 1.0, out)


def _single_value(value: Any, what: str, path: Path) -> int:
    """Per-layer arrays are fine while all layers agree."""
    if isinstance(value, list):
        if not value or len(set(value)) != 1:
            raise UnsupportedModelError(f"{path}: per-layer {what} values differ: {value[:8]}")
        value = value[0]
    return int(value)


def _float32_value(value: Any) -> float:
    """The shortest decimal that rounds to the same float32 (1e-05, not 9.99999974738e-06).

    GGUF stores these as float32; widening gives ugly doubles that differ from the original
    config.json by float32 rounding. Any consumer computing in float32 sees the same bits.
    """
    return float(str(np.float32(value)))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
