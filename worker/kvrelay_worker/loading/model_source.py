"""Turn what a user typed (a known name, a folder, a .gguf path) into one ModelSource.

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

    name: str  # the served model name: registry name, folder basename, or GGUF stem
    kind: SourceKind
    path: Path  # the folder, or the .gguf file
    cache_dir: Path | None
    registry_name: str | None = None


def resolve_model(name_or_path: str | os.PathLike[str]) -> ModelSource:
    """Resolve a registry name, a Hugging Face folder or a ``.gguf`` path.

    A plain string equal to a registry name means that model, even if a folder of the same
    name exists in the working directory (write ``./name`` for the folder).
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
        resolved = path.resolve()
        return ModelSource(resolved.name, "hf_folder", resolved, None)
    if path.is_file():
        if path.suffix != ".gguf":
            raise UnsupportedModelError(
                f"{path}: expected a Hugging Face folder or a .gguf file, got a {path.suffix!r} file"
            )
        resolved = path.resolve()
        return ModelSource(resolved.stem, "gguf", resolved, model_cache_dir(gguf_cache_name(path)))
    raise unknown_model_error(text)
