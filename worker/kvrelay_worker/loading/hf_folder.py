"""Read a Hugging Face model folder: ``config.json`` into a ModelConfig, safetensors into tensors.

This is also the format the GGUF converter writes into the cache, so ``hf_dict_from_config``
(the inverse of ``config_from_hf_dict``) lives here too: one place knows the mapping.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from io import BufferedReader
from pathlib import Path
from typing import Any

import torch

from kvrelay_worker.loading.gguf_config_json import WRITERS as FAMILY_WRITERS
from kvrelay_worker.loading.gguf_config_json import base_config_json, family_config_json
from kvrelay_worker.loading.load_progress import LoadProgress
from kvrelay_worker.loading.prequantized_config import PREQUANTIZED_KEY, checkpoint_scheme
from kvrelay_worker.loading.safetensors_reader import SafetensorsFile
from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.models.families import family_of_hf_config
from kvrelay_worker.models.family import rope_from_hf
from kvrelay_worker.models.layers import activation
from kvrelay_worker.models.model_config import ModelConfig

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"

# The families the GGUF converter writes a config.json for, and their architecture class.
_WRITABLE_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                           "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_DEFAULT_RMS_EPS = 1e-6
_LAYER_INDEX = re.compile(r"model\.layers\.(\d+)\.")


def is_hf_folder(path: Path) -> bool:
    """A folder we can read as a Hugging Face checkpoint (it has a ``config.json``)."""
    return path.is_dir() and (path / CONFIG_FILE).is_file()


def read_hf_config(folder: Path) -> ModelConfig:
    """Parse ``folder/config.json`` (plus the eos ids of ``generation_config.json``).

    ``generation.eos_token_id`` is what ``transformers.generate`` stops on; Llama 3 instruct
    lists more ids there than in config.json, so both are merged.
    """
    raw = _read_json(folder / CONFIG_FILE)
    config = config_from_hf_dict(raw, source=str(folder))
    generation_file = folder / GENERATION_CONFIG_FILE
    if generation_file.is_file():
        extra_eos = _as_id_tuple(_read_json(generation_file).get("eos_token_id"))
        merged = tuple(dict.fromkeys(config.eos_token_ids + extra_eos))
        if merged != config.eos_token_ids:
            config = dataclasses.replace(config, eos_token_ids=merged)
    return config


def config_from_hf_dict(raw: Mapping[str, Any], source: str = "config.json") -> ModelConfig:
    """Map a ``config.json`` dict to ModelConfig, refusing what the decoder cannot run.

    The keys every family shares are read here; the family's module reads its own
    (biases, windows, norms, experts) and may override these.
    """
    family = family_of_hf_config(list(raw.get("architectures") or []), raw.get("model_type"),
                                 source)
    scheme = None
    if raw.get("quantization_config"):
        # refuses what cannot be kept quantized (prequantized_config's docstring says what)
        scheme = checkpoint_scheme(raw["quantization_config"], source)
    hidden = _required_int(raw, "hidden_size", source)
    heads = _required_int(raw, "num_attention_heads", source)
    layers = _required_int(raw, "num_hidden_layers", source)
    kv_heads = int(raw.get("num_key_value_heads") or heads)
    head_dim = int(raw.get("head_dim") or hidden // heads)
    max_positions = int(raw.get("max_position_embeddings") or family.default_max_positions)
    rope_theta, rope_scaling = rope_from_hf(raw, source)
    extra: dict[str, Any] = {}
    declared_dtype = raw.get("dtype") or raw.get("torch_dtype")
    if declared_dtype is not None:
        extra["dtype"] = str(declared_dtype)
    if scheme is not None:
        extra[PREQUANTIZED_KEY] = scheme
    fields: dict[str, Any] = {
        "vocab_size": _required_int(raw, "vocab_size", source),
        "hidden_size": hidden,
        "intermediate_size": _required_int(raw, "intermediate_size", source),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(raw.get("rms_norm_eps") or _DEFAULT_RMS_EPS),
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", False)),
        "hidden_act": str(raw.get("hidden_act") or "silu"),
        "bos_token_id": _optional_int(raw.get("bos_token_id")),
        "eos_token_ids": _as_id_tuple(raw.get("eos_token_id")),
        "pad_token_id": _optional_int(raw.get("pad_token_id")),
        "model_type": family.name,
        "extra": extra,
    }
    fields.update(family.read_fields(raw, layers, source))
    activation(fields["hidden_act"])  # refuse an unknown activation now, not at build
    try:
        return ModelConfig(**fields)
    except ValueError as exc:
        raise UnsupportedModelError(f"{source}: {exc}") from exc


def hf_dict_from_config(config: ModelConfig, dtype: str = "float32") -> dict[str, Any]:
    """The ``config.json`` that makes transformers build the same model as ``config``.

    Uses the legacy ``rope_theta``/``rope_scaling`` keys, which transformers 4.x reads
    natively and 5.x converts into ``rope_parameters``.
    """
    if config.model_type in FAMILY_WRITERS:  # Gemma, Phi-3, MoE: gguf_config_json
        return family_config_json(config, dtype)
    if config.model_type not in _WRITABLE_ARCHITECTURES or config.sliding_layers:
        raise UnsupportedModelError(
            f"cannot write a config.json for model_type {config.model_type!r}"
        )
    if config.model_type == "qwen2" and (config.attention_output_bias or config.mlp_bias):
        raise UnsupportedModelError("Qwen2 has no o_proj or MLP bias")
    if config.model_type in ("llama", "qwen3") and (
        config.attention_bias != config.attention_output_bias
    ):
        raise UnsupportedModelError(
            f"{config.model_type}'s attention_bias switches q/k/v and o biases together; "
            "this model has only some"
        )
    if config.qk_norm != (config.model_type == "qwen3"):
        raise UnsupportedModelError(f"a {config.model_type} model with qk_norm={config.qk_norm}")
    out = base_config_json(config, _WRITABLE_ARCHITECTURES[config.model_type],
                           config.model_type, dtype)
    if config.model_type == "llama":
        out["attention_bias"] = config.attention_bias
        out["mlp_bias"] = config.mlp_bias
    elif config.model_type == "qwen3":
        out.update(attention_bias=config.attention_bias, use_sliding_window=False,
                   sliding_window=None, max_window_layers=config.num_hidden_layers)
    elif config.model_type == "qwen2":
        out.update(use_sliding_window=False, sliding_window=None)
        out["max_window_layers"] = config.num_hidden_layers
    else:
        out["sliding_window"] = None
    return out


def safetensors_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors files: the index's shards, else every ``*.safetensors``."""
    index = folder / SAFETENSORS_INDEX_FILE
    if index.is_file():
        shard_names = sorted(set(_read_json(index)["weight_map"].values()))
        files = [folder / name for name in shard_names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shards that are missing: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")) or any(folder.glob("*.pth")):
        raise UnsupportedModelError(
            f"{folder} holds only pickled PyTorch weights (*.bin/*.pt), which we never unpickle; "
            "convert them to safetensors first"
        )
    raise UnsupportedModelError(f"{folder} has no *.safetensors weights")


def iter_safetensors_weights(
    folder: Path, config: ModelConfig | None = None, *, progress: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` one tensor at a time, in the dtype stored on disk.

    Each tensor is read into fresh memory only when yielded (``safetensors_reader``: no
    memory map keeps the file resident), so peak memory is one tensor beyond what the
    consumer keeps. Tensors come grouped by what they fill: embeddings and LM head first,
    then layer by layer (``load_order``), so a loader that quantizes or places each part
    as it completes holds one part's float weights at a time. With tied embeddings
    ``lm_head.weight`` is never yielded (some exporters store a copy), and rotary
    ``inv_freq`` buffers from old checkpoints are skipped. A long read reports how far it
    has got (``LoadProgress``: log lines, and a bar on a terminal with ``progress``).
    """
    config = config if config is not None else read_hf_config(folder)
    where: dict[str, tuple[int, str]] = {}
    files = [SafetensorsFile(file) for file in safetensors_files(folder)]
    for index, stored in enumerate(files):
        for key in stored.names():
            name = _normalise_name(key)
            if name is None or (config.tie_word_embeddings and name == "lm_head.weight"):
                continue
            if name in where:
                raise ValueError(f"{folder}: tensor {name} appears in more than one shard")
            where[name] = (index, key)
    ordered = sorted(where, key=lambda name: (load_order(name), where[name][0],
                                              files[where[name][0]].tensors[where[name][1]].begin))
    total = sum(files[index].tensors[key].nbytes for index, key in where.values())
    handles: dict[int, BufferedReader] = {}
    try:
        with LoadProgress(total, folder.name, progress=progress) as bar:
            for name in ordered:
                index, key = where[name]
                if index not in handles:
                    handles[index] = files[index].path.open("rb")
                yield name, files[index].read(key, handles[index])
                bar.advance(files[index].tensors[key].nbytes)
    finally:
        for handle in handles.values():
            handle.close()


def load_order(name: str) -> tuple[int, int]:
    """Where a ``model.``-prefixed tensor comes in a load: the embedding table and LM head
    (the largest matrices, placed while the least else is resident), then each layer in
    turn, then the rest (final norm)."""
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (0, 0 if name.startswith("model.") else 1)
    match = _LAYER_INDEX.match(name)
    if match is not None:
        return (1, int(match.group(1)))
    return (2, 0)


def _normalise_name(key: str) -> str | None:
    """Map a stored key to its Hugging Face ``model.``-prefixed name, or None for a key to skip."""
    if key.endswith("rotary_emb.inv_freq"):
        return None
    if key.startswith("model.") or key == "lm_head.weight":
        return key
    # A bare LlamaModel/Qwen2Model export has no "model." prefix.
    return f"model.{key}"


def _read_json(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _required_int(raw: Mapping[str, Any], key: str, source: str) -> int:
    if raw.get(key) is None:
        raise UnsupportedModelError(f"{source}: config lacks {key!r}")
    return int(raw[key])


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    """eos_token_id may be absent, one id, or a list of ids."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)
