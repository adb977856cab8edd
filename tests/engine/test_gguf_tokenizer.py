"""A GGUF's tokenizer built from our parsed metadata equals transformers' own.

``load_tokenizer(file.gguf)`` builds it with transformers' converter from the header our
reader parsed (``gguf_fast_tokenizer``); ``AutoTokenizer.from_pretrained(gguf_file=...)``
re-reads the file. Class, backend, special tokens and ids, chat template, BOS/EOS flags,
token ids and decoded text must all agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from helpers.tiny_gguf import (
    CHATML_TEMPLATE,
    MERGES,
    TINY_VOCAB_SIZE,
    tiny_vocab,
    write_gguf_from_hf,
)
from helpers.tiny_models import build_tiny_model
from helpers.tokenizer_checks import assert_same_tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from kvrelay_worker.loading.gguf_metadata import GGUFFile
from kvrelay_worker.loading.tokenizer import gguf_fast_tokenizer, load_tokenizer


def reference(path: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name,
                                         local_files_only=True)


def test_smollm2_tokenizer_equals_transformers(smollm2_gguf: Path) -> None:
    ours = gguf_fast_tokenizer(GGUFFile(smollm2_gguf))
    assert ours is not None  # the fast path, not the fallback
    assert_same_tokenizer(ours, reference(smollm2_gguf))
    assert_same_tokenizer(load_tokenizer(smollm2_gguf), reference(smollm2_gguf))


@pytest.mark.parametrize("name", ["llama-mha-untied", "qwen2-gqa-bias-tied", "qwen3-qk-norm"])
def test_tiny_gguf_tokenizers_equal_transformers(name: str, tmp_path: Path) -> None:
    folder = build_tiny_model(name, tmp_path / name, vocab_size=TINY_VOCAB_SIZE)
    path = write_gguf_from_hf(folder, tmp_path / "tiny.gguf")
    ours = gguf_fast_tokenizer(GGUFFile(path))
    assert ours is not None
    assert_same_tokenizer(ours, reference(path))


def write_tokenizer_gguf(path: Path, arch: str, add_bos: bool, add_eos: bool,
                         pad: bool, name: str = "tiny") -> Path:
    """Just a tokenizer (and the few config keys transformers wants), BOS/EOS flags as given."""
    tokens, types = tiny_vocab()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch != "llama" else "default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if pad:
        writer.add_pad_token_id(0)
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(add_eos)
    writer.add_chat_template(CHATML_TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize(("add_bos", "add_eos", "pad"), [
    (True, False, True), (False, True, False), (True, True, True)])
def test_bos_eos_flags_and_pad_match(arch: str, add_bos: bool, add_eos: bool, pad: bool,
                                     tmp_path: Path) -> None:
    path = write_tokenizer_gguf(tmp_path / "tok.gguf", arch, add_bos, add_eos, pad)
    ours = load_tokenizer(path)
    assert_same_tokenizer(ours, reference(path))
    ids = ours.encode("the")
    assert (ids[0] == 1) == add_bos
    assert (ids[-1] == 2) == add_eos


def test_files_outside_the_fast_path_take_transformers_path(tmp_path: Path) -> None:
    path = write_tokenizer_gguf(tmp_path / "m.gguf", "llama", True, False, True,
                                name="Mistral tiny")
    assert gguf_fast_tokenizer(GGUFFile(path)) is None
    assert_same_tokenizer(load_tokenizer(path), reference(path))


def test_saved_tokenizer_files_match(tmp_path: Path) -> None:
    """The model cache saves the GGUF's tokenizer: same files as transformers' would write
    (bar the loader's own ``is_local``/``local_files_only`` flags)."""
    path = write_tokenizer_gguf(tmp_path / "tok.gguf", "qwen2", False, False, True)
    ours, ref = tmp_path / "ours", tmp_path / "ref"
    load_tokenizer(path).save_pretrained(str(ours))
    reference(path).save_pretrained(str(ref))
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in ref.iterdir())
    for saved in ref.iterdir():
        mine, theirs = (ours / saved.name).read_text(), saved.read_text()
        if saved.name == "tokenizer_config.json":
            flags = {"is_local", "local_files_only"}
            mine_json = {k: v for k, v in json.loads(mine).items() if k not in flags}
            assert mine_json == {k: v for k, v in json.loads(theirs).items() if k not in flags}
        else:
            assert mine == theirs, saved.name
