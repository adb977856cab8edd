"""Remember which tokenizer class ``AutoTokenizer`` picked for a model folder.

Why: to pick the class, ``AutoTokenizer`` builds the model's config class, and that class's
imports (transformers' kernel hub, ``torch.distributed.tensor``, sympy) cost about 1.5
CPU-seconds of every worker start, though the tokenizer needs none of it. The pick is a
function of the folder's path, its files other than weights, and the installed
transformers and tokenizers, so it is remembered under a digest of exactly those. A later
load with the same digest builds the same class with the arguments ``AutoTokenizer`` would
pass it (remembered too: they depend on the path and the files only); any change of those
inputs misses and takes ``AutoTokenizer`` again. ``AutoTokenizer`` itself is imported only
on a miss: importing it builds ``transformers.models``' import table by reading every
model's source files (another ~0.5 CPU-s). A class from a repository's own code is never
remembered, and a cache that cannot be read or written only costs the saving, never the
load.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import tokenizers
import transformers
from transformers import PreTrainedTokenizerBase

from kvrelay_worker.loading.cache_layout import cache_root

log = logging.getLogger(__name__)

# Files that hold weights: AutoTokenizer reads none of them to pick a class.
_WEIGHT_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt",
                              ".h5", ".msgpack", ".onnx", ".npz"})
# The choice of a folder whose small files together exceed this is not remembered (hashing
# them would cost more than the saving).
_MAX_HASHED_BYTES = 256 << 20


def choices_dir() -> Path:
    return cache_root() / "tokenizer-choices"


def folder_digest(folder: Path) -> str | None:
    """A digest of what ``AutoTokenizer``'s pick depends on, or None (too large to hash)."""
    resolved = folder.resolve()
    sha = hashlib.sha256()
    for part in (str(resolved), transformers.__version__, tokenizers.__version__):
        sha.update(part.encode() + b"\0")
    total = 0
    for entry in sorted(resolved.iterdir(), key=lambda p: p.name):
        if not entry.is_file() or entry.suffix in _WEIGHT_SUFFIXES:
            continue
        total += entry.stat().st_size
        if total > _MAX_HASHED_BYTES:
            return None
        sha.update(entry.name.encode() + b"\0")
        sha.update(hashlib.sha256(entry.read_bytes()).digest())
    return sha.hexdigest()


def _auto_kwargs(folder: Path) -> dict[str, Any]:
    """The arguments ``AutoTokenizer.from_pretrained(folder, local_files_only=True)`` hands
    the class it picks: its ``_from_auto`` flag, the revision it resolved (a local folder's
    is returned as given) and the tokenizer config's commit hash (a Hugging Face cache
    snapshot's folder names one)."""
    from transformers.models.auto.tokenization_auto import get_tokenizer_config
    from transformers.utils.hub import resolve_revision

    kwargs: dict[str, Any] = {"local_files_only": True, "_from_auto": True}
    kwargs["revision"] = resolve_revision(str(folder), None, local_files_only=True)
    tokenizer_config = get_tokenizer_config(str(folder), **kwargs)
    kwargs["_commit_hash"] = tokenizer_config.get("_commit_hash", None)
    return kwargs


def _remembered(digest: str) -> tuple[type[PreTrainedTokenizerBase], dict[str, Any]] | None:
    """The class and arguments remembered under ``digest``, or None."""
    try:
        record = json.loads((choices_dir() / f"{digest}.json").read_text())
        module = importlib.import_module(record["module"])
        cls = getattr(module, record["name"])
        kwargs = dict(record["kwargs"])
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError):
        return None
    if not (isinstance(cls, type) and issubclass(cls, PreTrainedTokenizerBase)):
        return None
    return cls, kwargs


def _remember(digest: str, cls: type, kwargs: dict[str, Any]) -> None:
    if not cls.__module__.startswith("transformers."):
        return  # a repository's own code: its pick is AutoTokenizer's business each time
    target = choices_dir() / f"{digest}.json"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(
            {"module": cls.__module__, "name": cls.__name__, "kwargs": kwargs}))
        temporary.replace(target)
    except (OSError, TypeError) as exc:
        log.debug("could not remember the tokenizer class (%s)", exc)


def load_folder_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(folder, local_files_only=True)``, through the class
    it picked last time for the same folder, files and library versions."""
    try:
        digest = folder_digest(folder)
    except OSError:
        digest = None
    if digest is not None and (found := _remembered(digest)) is not None:
        cls, kwargs = found
        tokenizer: PreTrainedTokenizerBase = cls.from_pretrained(str(folder), **kwargs)
        return tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if digest is not None:
        _remember(digest, type(tokenizer), _auto_kwargs(folder))
    return tokenizer
