"""Turn what a user typed (a known name, a folder, a .gguf path, a Hugging Face Hub
repository ``org/name[@revision][:QUANT]``) into one ModelSource.

Kept apart from ``loader.py`` so the cache (which converts GGUF sources) and the loader
(which uses the cache) can both resolve names without importing each other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvrelay_worker.loading.cache_layout import gguf_cache_name, model_cache_dir
from kvrelay_worker.loading.hf_folder import CONFIG_FILE, is_hf_folder
from kvrelay_worker.loading.hub_name import local_served_name, parse_hub_name
from kvrelay_worker.loading.registry import (
    is_known_model,
    registry_model_path,
    unknown_model_error,
)
from kvrelay_worker.models.errors import UnknownModelError, UnsupportedModelError

SourceKind = Literal["hf_folder", "gguf"]


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are and what it is served as.

    ``kind == "gguf"`` sources are converted into ``cache_dir`` before loading;
    ``hf_folder`` sources load in place (``cache_dir`` is None).
    """

    name: str  # the served model name: registry name, folder basename, GGUF stem, org/name
    kind: SourceKind
    path: Path  # the folder, or the .gguf file
    cache_dir: Path | None
    registry_name: str | None = None


def resolve_model(name_or_path: str | os.PathLike[str]) -> ModelSource:
    """Resolve a registry name, a Hugging Face folder, a ``.gguf`` path or a repository.

    A plain string equal to a registry name means that model, even if a folder of the same
    name exists in the working directory (write ``./name`` for the folder). An existing
    path wins over reading the string as ``org/name``; a repository is fetched into the
    Hugging Face cache (only what is missing) before this returns.
    """
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, str) and is_known_model(text):
        path = registry_model_path(text)
        return ModelSource(text, "gguf", path, model_cache_dir(text), registry_name=text)
    path = Path(text).expanduser()
    if path.is_dir():
        if not is_hf_folder(path):
            raise UnknownModelError(
                f"{path} is a folder without {CONFIG_FILE}: not a Hugging Face model folder"
            )
        return ModelSource(local_served_name(path), "hf_folder", path.resolve(), None)
    if path.is_file():
        if path.suffix != ".gguf":
            raise UnsupportedModelError(
                f"{path}: expected a Hugging Face folder or a .gguf file, got a {path.suffix!r} file"
            )
        return ModelSource(local_served_name(path), "gguf", path.resolve(),
                           model_cache_dir(gguf_cache_name(path)))
    hub = parse_hub_name(text) if isinstance(name_or_path, str) else None
    if hub is not None:
        from kvrelay_worker.loading.hub_model import fetch_hub_model  # imports the hub

        fetched = fetch_hub_model(hub)
        cache_dir = (model_cache_dir(gguf_cache_name(fetched.path))
                     if fetched.kind == "gguf" else None)
        return ModelSource(hub.served_name, fetched.kind, fetched.path, cache_dir)
    raise unknown_model_error(text)
