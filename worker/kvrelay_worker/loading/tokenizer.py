"""Load a Hugging Face tokenizer from a model folder or from a GGUF file's metadata."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from kvrelay_worker.loading.gguf_metadata import GGUFFile
from kvrelay_worker.loading.tokenizer_choice import load_folder_tokenizer
from kvrelay_worker.models.errors import UnknownModelError, UnsupportedModelError

# The class ``AutoTokenizer.from_pretrained(gguf_file=...)`` picks for the config each GGUF
# architecture maps to (tests/engine/test_gguf_tokenizer.py and test_gguf_families.py check
# it). Byte-level BPE (``tokenizer.ggml.model == "gpt2"``) and SentencePiece (``llama``)
# vocabularies, which transformers' ``convert_gguf_tokenizer`` builds per architecture
# (Gemma's and Phi-3's SentencePiece quirks included); other files take transformers' path.
_FAST_PATH_CLASSES = {"llama": "TokenizersBackend", "qwen2": "Qwen2Tokenizer",
                      "qwen3": "Qwen2Tokenizer", "qwen3moe": "Qwen2Tokenizer",
                      "gemma2": "GemmaTokenizer", "gemma3": "GemmaTokenizer",
                      "phi3": "TokenizersBackend"}
_FAST_PATH_TOKENIZER_TYPES = {"gpt2", "llama"}
# transformers' get_gguf_tokenizer: special token attribute -> metadata key suffix
_SPECIAL_TOKEN_IDS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def load_tokenizer(
    path_or_folder: str | os.PathLike[str], gguf: GGUFFile | None = None
) -> PreTrainedTokenizerBase:
    """The tokenizer of a Hugging Face folder, or the one a ``.gguf`` file embeds.

    For GGUF, the fast tokenizer is built from the metadata we parse ourselves (``gguf``,
    the file's already parsed header, saves reading it again) with transformers' own
    converter, giving what ``AutoTokenizer.from_pretrained(gguf_file=...)`` gives without
    its seconds of re-reading the file (``gguf_fast_tokenizer``); files it does not cover
    take transformers' path. The chat template stored in the file is set on
    ``tokenizer.chat_template`` either way. A folder's tokenizer is ``AutoTokenizer``'s,
    built through the class it picked before (``tokenizer_choice``). Never touches the
    network.
    """
    path = Path(path_or_folder).expanduser()
    if path.is_dir():
        return load_folder_tokenizer(path)
    if path.is_file() and path.suffix == ".gguf":
        try:
            header = gguf if gguf is not None else GGUFFile(path)
        except (ValueError, OSError) as exc:
            raise UnsupportedModelError(f"{path} is not a readable GGUF file: {exc}") from exc
        try:
            tokenizer = gguf_fast_tokenizer(header)
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(
                    str(path.parent), gguf_file=path.name, local_files_only=True
                )
        except (ValueError, KeyError, IndexError, NotImplementedError) as exc:
            raise UnsupportedModelError(f"{path}: cannot build a tokenizer from it: {exc}") from exc
        if not tokenizer.chat_template:
            # Older transformers drop the template; read it from the metadata ourselves.
            template = header.value("tokenizer.chat_template")
            if template:
                tokenizer.chat_template = str(template)
        return tokenizer
    if path.exists():
        raise UnsupportedModelError(f"{path}: expected a model folder or a .gguf file")
    raise UnknownModelError(f"{path}: no such file or folder")


def gguf_fast_tokenizer(gguf: GGUFFile) -> PreTrainedTokenizerBase | None:
    """The tokenizer ``AutoTokenizer.from_pretrained(gguf_file=...)`` builds, from our metadata.

    Mirrors transformers' ``get_gguf_tokenizer`` (metadata renamed by its
    ``GGUF_TOKENIZER_MAPPING``, special tokens by id) and hands the result to its
    ``convert_gguf_tokenizer``. None where that is not known to give the same tokenizer: an
    architecture or vocabulary type outside ``_FAST_PATH_*``, a file transformers would
    treat as Mistral, or a transformers without these helpers.
    """
    architecture = gguf.value("general.architecture")
    class_name = _FAST_PATH_CLASSES.get(str(architecture))
    if class_name is None or gguf.value("tokenizer.ggml.model") not in _FAST_PATH_TOKENIZER_TYPES:
        return None
    if "mistral" in str(gguf.value("general.name", "")).lower():
        return None  # transformers renames the architecture to mistral
    try:
        import transformers
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING,
            convert_gguf_tokenizer,
        )
    except ImportError:
        return None
    tokenizer_class = getattr(transformers, class_name, None)
    if tokenizer_class is None:
        return None
    metadata = {key: entry.value for key, entry in gguf.fields.items()}
    grouped: dict[str, dict[str, Any]] = {
        group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items()
                if f"tokenizer.{key}" in metadata}
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tokenizer_dict, tokenizer_config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer_dict.get("tokenizer_type") == "llama":
        # as transformers: llama.cpp adds BOS to a SentencePiece vocabulary saying nothing
        tokenizer_config.setdefault("add_bos_token", True)
    for name, key in _SPECIAL_TOKEN_IDS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        tokenizer_config[name] = (
            tokenizer_dict["tokens"][token_id] if token_id is not None else None
        )
    backend, additional = convert_gguf_tokenizer(str(architecture), tokenizer_dict)
    tokenizer: PreTrainedTokenizerBase = tokenizer_class(
        tokenizer_object=backend, **tokenizer_config, **additional
    )
    return tokenizer
