"""Load a Hugging Face tokenizer from a model folder or from a GGUF file's metadata."""

from __future__ import annotations

import os
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from kvrelay_worker.loading.gguf_file import GGUFCheckpoint
from kvrelay_worker.models.errors import UnknownModelError, UnsupportedModelError


def load_tokenizer(path_or_folder: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """The tokenizer of a Hugging Face folder, or the one a ``.gguf`` file embeds.

    For GGUF, transformers rebuilds a fast tokenizer from the vocabulary and merges in the
    metadata (a few seconds for a 50k vocabulary: the cache saves the result once). The
    chat template stored in the file is set on ``tokenizer.chat_template`` either way.
    Never touches the network.
    """
    path = Path(path_or_folder).expanduser()
    if path.is_dir():
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if path.is_file() and path.suffix == ".gguf":
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                str(path.parent), gguf_file=path.name, local_files_only=True
            )
        except (ValueError, KeyError, NotImplementedError) as exc:
            raise UnsupportedModelError(f"{path}: cannot build a tokenizer from it: {exc}") from exc
        if not tokenizer.chat_template:
            # Older transformers drop the template; read it from the metadata ourselves.
            template = GGUFCheckpoint(path).chat_template
            if template:
                tokenizer.chat_template = template
        return tokenizer
    if path.exists():
        raise UnsupportedModelError(f"{path}: expected a model folder or a .gguf file")
    raise UnknownModelError(f"{path}: no such file or folder")
