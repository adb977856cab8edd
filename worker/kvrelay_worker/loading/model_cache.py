"""Convert a GGUF file once into a Hugging Face folder in the local cache.

Dequantising and un-permuting a GGUF takes seconds to minutes; loading the float32
safetensors it becomes takes well under a second per GB, and transformers itself can load
the folder (the reference for our parity tests). So a GGUF is converted on first use:

- into a temporary sibling folder, published with one ``rename`` after the marker file is
  written, so a crash never leaves a folder that looks complete;
- under an exclusive file lock, so two workers starting together convert only once;
- again whenever the source's size or mtime (or the converter version) changes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm.auto import tqdm

from kvrelay_worker.loading.cache_layout import (
    SourceFingerprint,
    is_prepared,
    write_marker,
)
from kvrelay_worker.loading.gguf_file import GGUFCheckpoint
from kvrelay_worker.loading.hf_folder import (
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    hf_dict_from_config,
)
from kvrelay_worker.loading.model_source import ModelSource, resolve_model
from kvrelay_worker.loading.safetensors_writer import write_safetensors_streaming
from kvrelay_worker.loading.tokenizer import load_tokenizer
from kvrelay_worker.models.model_config import ModelConfig

WEIGHTS_FILE = "model.safetensors"

try:  # POSIX only; elsewhere concurrent preparers may both convert (still safe, just slower)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def prepare_model(
    name_or_path: str | os.PathLike[str] | ModelSource, progress: bool = True
) -> Path:
    """A Hugging Face folder for the model: converted into the cache for GGUF sources.

    A Hugging Face folder is returned as is. A registry name or ``.gguf`` path returns
    ``<cache>/models/<name>/``, converting only if it is missing or stale.
    """
    source = name_or_path if isinstance(name_or_path, ModelSource) else resolve_model(name_or_path)
    if source.kind == "hf_folder":
        return source.path
    assert source.cache_dir is not None
    return prepare_gguf(source.path, source.cache_dir, progress=progress, label=source.name)


def prepare_gguf(gguf_path: Path, target: Path, progress: bool = True, label: str = "") -> Path:
    """Make ``target`` a complete conversion of ``gguf_path`` (a no-op when it already is)."""
    if is_prepared(target, gguf_path):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.parent / f".{target.name}.lock"):
        if is_prepared(target, gguf_path):  # another process converted it meanwhile
            return target
        _remove_leftovers(target)
        fingerprint = SourceFingerprint.of(
            gguf_path
        )  # before reading: a change mid-way re-converts
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            config = convert_gguf_to_hf_folder(
                gguf_path, tmp, progress=progress, label=label or target.name
            )
            write_marker(tmp, fingerprint, format="gguf", model_type=config.model_type)
            _publish(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def convert_gguf_to_hf_folder(
    gguf_path: Path, folder: Path, progress: bool = False, label: str = ""
) -> ModelConfig:
    """Write config.json, generation_config.json, tokenizer files and float32 safetensors.

    Holds one dequantised tensor in memory at a time. ``folder`` must exist.
    """
    checkpoint = GGUFCheckpoint(gguf_path)
    config = checkpoint.config
    load_tokenizer(gguf_path, checkpoint.reader).save_pretrained(str(folder))
    _write_json(folder / CONFIG_FILE, hf_dict_from_config(config, dtype="float32"))
    _write_json(folder / GENERATION_CONFIG_FILE, _generation_config(config))

    specs = checkpoint.tensor_specs()
    total = sum(4 * math.prod(spec.shape) for spec in specs)
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc=f"Converting {label or gguf_path.name}",
        disable=not progress,
    ) as bar:

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            for spec in specs:
                tensor = checkpoint.load_tensor(spec)
                yield spec.name, tensor
                bar.update(4 * tensor.numel())

        write_safetensors_streaming(
            folder / WEIGHTS_FILE,
            [(spec.name, spec.shape) for spec in specs],
            stream(),
            dtype=torch.float32,
            metadata={"converted_from": gguf_path.name},
        )
    return config


def _generation_config(config: ModelConfig) -> dict[str, object]:
    eos = list(config.eos_token_ids)
    return {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": config.pad_token_id,
    }


def _publish(tmp: Path, target: Path) -> None:
    """Swap ``tmp`` in as ``target``: a stale target is renamed away first, then deleted."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
    os.rename(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_leftovers(target: Path) -> None:
    """Delete temporary folders a crashed conversion left (only lock holders create them)."""
    for pattern in (f".{target.name}.tmp-*", f".{target.name}.old-*"):
        for leftover in target.parent.glob(pattern):
            shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    with lock_path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _write_json(path: Path, payload: object) -> None:
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
