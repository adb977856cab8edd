"""A model's config, weights and tokenizer, from whatever source names it.

Whatever the source (a known name, a Hugging Face folder, a ``.gguf`` file), float weights
are read from a Hugging Face folder: GGUF sources are converted into the cache first, so the
decoder sees one naming scheme and one layout. An engine that keeps a GGUF's quantized
blocks reads them from the file itself; for it the float32 copy (four times the file on a
4-bit model, and the longest part of a first start) is not made (``keep_gguf``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from kvrelay_worker.loading.cache_layout import is_prepared
from kvrelay_worker.loading.gguf_file import GGUFCheckpoint
from kvrelay_worker.loading.hf_folder import iter_safetensors_weights, read_hf_config
from kvrelay_worker.loading.model_cache import prepare_model
from kvrelay_worker.loading.model_source import ModelSource, resolve_model
from kvrelay_worker.loading.tokenizer import load_tokenizer
from kvrelay_worker.models.model_config import ModelConfig


class LoadedModelFiles:
    """A model ready to build: its config now, its weights and tokenizer on demand.

    ``weights()`` streams ``(name, tensor)`` pairs named as in the Hugging Face
    checkpoint (q/k in rotate-half order; no ``lm_head.weight`` when embeddings
    are tied), in the dtype stored on disk (float32 for converted GGUF files). Each call
    starts a fresh pass over the files. ``path`` is the folder, or the ``.gguf`` file when
    it was not converted (``keep_gguf``): ``weights()`` then converts it first.
    """

    def __init__(self, source: ModelSource, path: Path, config: ModelConfig,
                 checkpoint: GGUFCheckpoint | None = None, *, progress: bool = False) -> None:
        self.source = source
        self.progress = progress  # a bar on a terminal while weights load (logs always)
        self.name = source.name
        self.path = path
        self.config = config
        self._checkpoint = checkpoint

    def gguf_checkpoint(self) -> GGUFCheckpoint:
        """The GGUF file, opened once (its header parsed once, for the tokenizer too)."""
        if self._checkpoint is None:
            self._checkpoint = GGUFCheckpoint(self.source.path)
        return self._checkpoint

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        folder = self.path if self.path.is_dir() else prepare_model(self.source, progress=False)
        return iter_safetensors_weights(folder, self.config, progress=self.progress)

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """Loaded on first use (a GGUF's from the header already parsed, if any)."""
        header = self._checkpoint.reader if self._checkpoint is not None else None
        return load_tokenizer(self.path, header if self.path.is_file() else None)

    def __repr__(self) -> str:
        return f"LoadedModelFiles(name={self.name!r}, path={str(self.path)!r})"


def load_model_source(
    name_or_path: str | os.PathLike[str], progress: bool = False, *, keep_gguf: bool = False
) -> LoadedModelFiles:
    """Resolve ``name_or_path``, convert it into the cache if it is a GGUF, read its config.

    With ``keep_gguf`` (the caller reads a GGUF's quantized blocks from the file), a GGUF
    not converted yet stays so: its config and tokenizer are read from the file.
    Raises UnknownModelError for an unknown name or a missing path, and
    UnsupportedModelError for a model the decoder cannot run.
    """
    source = resolve_model(name_or_path)
    if keep_gguf and source.kind == "gguf":
        assert source.cache_dir is not None
        if not is_prepared(source.cache_dir, source.path):
            checkpoint = GGUFCheckpoint(source.path)
            return LoadedModelFiles(source, source.path, checkpoint.config, checkpoint,
                                    progress=progress)
    folder = prepare_model(source, progress=progress)
    return LoadedModelFiles(source, folder, read_hf_config(folder), progress=progress)
