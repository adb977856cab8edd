"""Model loading: resolve a name, a path or a Hub repository, convert and cache it, load its
weights, list models.

The one door the engine and the ``kvrelay`` command use. The decoder itself (layers,
attention, rotary tables, the model class) lives in ``kvrelay_worker.models`` and knows
nothing of files; this package turns a name, a Hugging Face folder or a ``.gguf`` file
into what the decoder is built from. Names load on first use, so listing models or
checking a name imports neither torch nor transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvrelay_worker.loading.cache_layout import gguf_cache_name, is_prepared, model_cache_dir
    from kvrelay_worker.loading.gguf_file import GGUFCheckpoint
    from kvrelay_worker.loading.gguf_quantized_model import build_gguf_quantized_model
    from kvrelay_worker.loading.gguf_storage import GGUFStorage
    from kvrelay_worker.loading.gguf_storage import gguf_storage as read_gguf_storage
    from kvrelay_worker.loading.hf_folder import safetensors_files
    from kvrelay_worker.loading.hub_errors import HubAccessError
    from kvrelay_worker.loading.hub_fetch import HubSettings, fetch_repo
    from kvrelay_worker.loading.hub_name import HubName, default_served_name, parse_hub_name
    from kvrelay_worker.loading.lora_folder import LoraWeights, read_lora_folder
    from kvrelay_worker.loading.model_cache import prepare_model
    from kvrelay_worker.loading.model_files import LoadedModelFiles, load_model_source
    from kvrelay_worker.loading.model_source import ModelSource, resolve_model
    from kvrelay_worker.loading.prequantized_config import PREQUANTIZED_KEY
    from kvrelay_worker.loading.prequantized_model import build_prequantized_model
    from kvrelay_worker.loading.registry import (
        DEFAULT_MODEL,
        REGISTRY,
        is_known_model,
        known_models,
        registry_model_path,
        unknown_model_error,
    )
    from kvrelay_worker.loading.tokenizer import load_tokenizer
    from kvrelay_worker.models.errors import UnknownModelError, UnsupportedModelError

# Public name -> the module that defines it.
_HOMES: dict[str, str | tuple[str, str]] = {
    "gguf_cache_name": "kvrelay_worker.loading.cache_layout",
    "is_prepared": "kvrelay_worker.loading.cache_layout",
    "model_cache_dir": "kvrelay_worker.loading.cache_layout",
    "safetensors_files": "kvrelay_worker.loading.hf_folder",
    "HubAccessError": "kvrelay_worker.loading.hub_errors",
    "fetch_repo": "kvrelay_worker.loading.hub_fetch",
    "HubSettings": "kvrelay_worker.loading.hub_fetch",
    "HubName": "kvrelay_worker.loading.hub_name",
    "default_served_name": "kvrelay_worker.loading.hub_name",
    "parse_hub_name": "kvrelay_worker.loading.hub_name",
    "LoraWeights": "kvrelay_worker.loading.lora_folder",
    "read_lora_folder": "kvrelay_worker.loading.lora_folder",
    "build_gguf_quantized_model": "kvrelay_worker.loading.gguf_quantized_model",
    "GGUFCheckpoint": "kvrelay_worker.loading.gguf_file",
    "GGUFStorage": "kvrelay_worker.loading.gguf_storage",
    # The function is named like its module; exported under a name the import system
    # cannot shadow with the submodule.
    "read_gguf_storage": ("kvrelay_worker.loading.gguf_storage", "gguf_storage"),
    "prepare_model": "kvrelay_worker.loading.model_cache",
    "LoadedModelFiles": "kvrelay_worker.loading.model_files",
    "load_model_source": "kvrelay_worker.loading.model_files",
    "ModelSource": "kvrelay_worker.loading.model_source",
    "PREQUANTIZED_KEY": "kvrelay_worker.loading.prequantized_config",
    "build_prequantized_model": "kvrelay_worker.loading.prequantized_model",
    "resolve_model": "kvrelay_worker.loading.model_source",
    "DEFAULT_MODEL": "kvrelay_worker.loading.registry",
    "REGISTRY": "kvrelay_worker.loading.registry",
    "is_known_model": "kvrelay_worker.loading.registry",
    "known_models": "kvrelay_worker.loading.registry",
    "registry_model_path": "kvrelay_worker.loading.registry",
    "unknown_model_error": "kvrelay_worker.loading.registry",
    "load_tokenizer": "kvrelay_worker.loading.tokenizer",
    "UnknownModelError": "kvrelay_worker.models.errors",
    "UnsupportedModelError": "kvrelay_worker.models.errors",
}

__all__ = [
    "DEFAULT_MODEL",
    "PREQUANTIZED_KEY",
    "REGISTRY",
    "GGUFCheckpoint",
    "GGUFStorage",
    "HubAccessError",
    "HubName",
    "HubSettings",
    "LoadedModelFiles",
    "LoraWeights",
    "ModelSource",
    "UnknownModelError",
    "UnsupportedModelError",
    "build_gguf_quantized_model",
    "build_prequantized_model",
    "default_served_name",
    "fetch_repo",
    "gguf_cache_name",
    "is_known_model",
    "is_prepared",
    "known_models",
    "load_model_source",
    "load_tokenizer",
    "model_cache_dir",
    "parse_hub_name",
    "prepare_model",
    "read_gguf_storage",
    "read_lora_folder",
    "registry_model_path",
    "resolve_model",
    "safetensors_files",
    "unknown_model_error",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = home if isinstance(home, tuple) else (home, name)
    return getattr(importlib.import_module(module), attr)
