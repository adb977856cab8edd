"""A model named ``org/name[@revision][:QUANT]``: fetch what the loader reads, nothing more.

From the repository's file list: a Hugging Face checkpoint fetches its config and
tokenizer files (the small top-level ``.json``, ``.jinja``, ``.txt``, ``tokenizer.model``
files) and its safetensors weights (the shards the index names, else every top-level
``*.safetensors``), never ``.bin``/``.pth``/ONNX/GGUF copies beside them; a ``:QUANT``
name (or a repository of GGUF files alone) fetches the one ``.gguf`` file it picks, which
carries its own tokenizer. The result is what ``model_source.resolve_model`` makes an
ordinary ModelSource of: a folder to load as is, or a GGUF converted into kvrelay's cache
like any other.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvrelay_worker.loading.gguf_pick import gguf_files, pick_gguf, single_gguf
from kvrelay_worker.loading.hf_folder import CONFIG_FILE, SAFETENSORS_INDEX_FILE
from kvrelay_worker.loading.hub_fetch import HubRepo
from kvrelay_worker.loading.hub_name import HubName
from kvrelay_worker.models.errors import UnknownModelError, UnsupportedModelError

_SMALL_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")
_PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_SAFETENSORS = ".safetensors"


@dataclass(frozen=True)
class FetchedModel:
    """Where a fetched model is: a Hugging Face folder, or one ``.gguf`` file."""

    kind: Literal["hf_folder", "gguf"]
    path: Path


def fetch_hub_model(name: HubName, *, progress: bool = True) -> FetchedModel:
    """Fetch model ``name`` into the Hugging Face cache (what is missing only) and say
    where it is."""
    repo = HubRepo(name, progress=progress)
    files = repo.files()
    top = [f for f in files if "/" not in f]
    if name.quant is None and CONFIG_FILE in top and _weights_listed(top):
        return FetchedModel("hf_folder", _fetch_checkpoint(repo, top))
    if name.quant is not None:
        chosen = pick_gguf(files, name.quant, name.repo_id)
    elif gguf_files(files):
        chosen = single_gguf(files, name.repo_id)
    else:
        raise _nothing_to_load(name, top)
    path = repo.fetch([glob.escape(chosen)]) / chosen
    if not path.is_file():  # the branch moved between the listing and the fetch
        raise UnknownModelError(f"{name}: {chosen} vanished from the repository; try again")
    return FetchedModel("gguf", path)


def _weights_listed(top: list[str]) -> bool:
    return SAFETENSORS_INDEX_FILE in top or any(f.endswith(_SAFETENSORS) for f in top)


def _fetch_checkpoint(repo: HubRepo, top: list[str]) -> Path:
    """Config, tokenizer and weights; with an index, the shards it names (read from the
    index itself, so a second ``model-*.safetensors`` set beside it is left alone)."""
    small = [f for f in top if f.endswith(_SMALL_SUFFIXES)]
    if SAFETENSORS_INDEX_FILE in top:
        folder = repo.fetch(_exact(small))
        index = json.loads((folder / SAFETENSORS_INDEX_FILE).read_text(encoding="utf-8"))
        weights = sorted(set(index.get("weight_map", {}).values()))
    else:
        weights = [f for f in top if f.endswith(_SAFETENSORS)]
        # Mistral's repositories carry its own format beside the transformers one.
        native = [f for f in weights if f.startswith("consolidated")]
        if native and len(native) < len(weights):
            weights = [f for f in weights if f not in native]
    return repo.fetch(_exact(small + weights))


def _exact(names: list[str]) -> list[str]:
    """Patterns that match exactly these names (``[`` and ``*`` in a name are literal)."""
    return [glob.escape(name) for name in names]


def _nothing_to_load(name: HubName, top: list[str]) -> Exception:
    if CONFIG_FILE in top and any(f.endswith(_PICKLED_SUFFIXES) for f in top):
        return UnsupportedModelError(
            f"{name.repo_id} holds only pickled PyTorch weights (*.bin/*.pth), which kvrelay "
            "never unpickles: pick a repository with safetensors weights, or a GGUF one "
            "(org/name:Q4_K_M)")
    return UnsupportedModelError(
        f"{name.repo_id} holds neither a config.json with safetensors weights nor a .gguf "
        f"file (its top-level files: {', '.join(top[:12]) or 'none'})")
