"""Where converted models live on disk, and how to tell a finished conversion from a stale one.

Layout: ``<root>/models/<name>/`` is a Hugging Face folder; ``<root>`` is
``$KVRELAY_CACHE_DIR`` or ``~/.cache/kvrelay``. A folder counts as prepared only when its
marker file (written last, inside the temporary folder before the atomic rename) records
the same source content (size and a digest of its first and last MiB) and converter
version as now. Content, not path or mtime: two checkouts (or two venvs) holding the same
GGUF share one conversion instead of rebuilding it over each other.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CACHE_DIR_ENV = "KVRELAY_CACHE_DIR"
MARKER_FILE = "kvrelay-source.json"
# Bump when the converter's output changes, so old cache folders are rebuilt.
CONVERTER_VERSION = 1
# Files a prepared folder must hold besides the marker.
REQUIRED_FILES = ("config.json", "model.safetensors", "generation_config.json")


_SAMPLE_BYTES = 1 << 20


@dataclass(frozen=True)
class SourceFingerprint:
    """Identifies the content a cache folder was converted from (cheap to recompute)."""

    size: int
    digest: str
    converter_version: int = CONVERTER_VERSION

    @classmethod
    def of(cls, source: Path) -> SourceFingerprint:
        resolved = source.resolve()
        size = resolved.stat().st_size
        sha = hashlib.sha256(size.to_bytes(8, "little"))
        with resolved.open("rb") as f:
            sha.update(f.read(_SAMPLE_BYTES))
            if size > _SAMPLE_BYTES:
                f.seek(max(_SAMPLE_BYTES, size - _SAMPLE_BYTES))
                sha.update(f.read(_SAMPLE_BYTES))
        return cls(size, sha.hexdigest())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def cache_root() -> Path:
    """``$KVRELAY_CACHE_DIR`` if set, else ``~/.cache/kvrelay``."""
    configured = os.environ.get(CACHE_DIR_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "kvrelay"


def models_root() -> Path:
    return cache_root() / "models"


def model_cache_dir(name: str) -> Path:
    """The folder a model converts into (``name`` must be a safe single path component)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ValueError(f"{name!r} is not a valid cache folder name")
    return models_root() / name


def gguf_cache_name(gguf_path: Path) -> str:
    """Cache folder name for an arbitrary GGUF file: its stem plus a hash of its location.

    The hash keeps two files called ``model.gguf`` in different folders from evicting
    each other's conversion.
    """
    resolved = str(gguf_path.expanduser().resolve())
    digest = hashlib.sha256(resolved.encode()).hexdigest()[:10]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", gguf_path.stem).strip(".-") or "model"
    return f"{stem}-{digest}"


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker's content, or None when absent or unreadable."""
    try:
        data = json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_marker(folder: Path, fingerprint: SourceFingerprint, **extra: Any) -> None:
    payload = {"source": fingerprint.to_json(), **extra}
    (folder / MARKER_FILE).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def is_prepared(folder: Path, source: Path) -> bool:
    """True when ``folder`` is a complete conversion of ``source`` as it is now."""
    marker = read_marker(folder)
    if marker is None or not all((folder / f).is_file() for f in REQUIRED_FILES):
        return False
    try:
        current = SourceFingerprint.of(source)
    except OSError:
        return False
    return marker.get("source") == current.to_json()
