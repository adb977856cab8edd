"""GGUF files made by llama.cpp's own converter from the tiny models of each family.

``convert_hf_to_gguf.py`` comes from the llama.cpp source the benchmarks use
(``benchmarks/harness/llamacpp.py``), unpacked once under ``$KVRELAY_CACHE_DIR``; the
tiny Hugging Face folders and their F32 / Q8_0 conversions are kept beside it, keyed by
everything that shapes them, so CI converts once. Tests skip (never fail) when the
source cannot be had.

Each model is chosen so that llama.cpp can express it: Gemma's lm_head is tied (the
converter drops an untied one), Gemma 3 windows five layers in six (the pattern llama.cpp
assumes when the file states none), Qwen3-MoE routes on every layer (llama.cpp has no dense
layers in ``qwen3moe``, and always renormalises the top-k weights). Phi-3 and Gemma 2 need a
SentencePiece ``tokenizer.model``: a tiny one (400 pieces, which keeps the models small) is
trained with ``sentencepiece`` itself, and the Hugging Face tokenizer is built from it by
transformers (``SentencePieceExtractor``); Gemma 3 and Mixtral take it too. Qwen3-MoE's
converter takes only byte-level BPE vocabularies it recognises, so it gets SmolLM2's.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import io
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers.benchmark_scripts import benchmarks_on_path
from helpers.calibration_text import CALIBRATION
from helpers.tiny_models import TINY_MODELS, build_tiny_model

VERSION = 1  # bump when the way the files are made changes


@dataclass(frozen=True)
class ConvertedModel:
    tiny: str  # name in helpers.tiny_models
    tokenizer: str  # "smollm2", "gemma-spm" (no dummy prefix) or "llama-spm" (Phi-3's)
    overrides: dict[str, Any] = field(default_factory=dict)


CONVERTED: dict[str, ConvertedModel] = {
    "phi3": ConvertedModel("phi3-fused", "llama-spm"),
    # long-context RoPE, which llama.cpp stores as two factor tensors (config only: the
    # engine does not run longrope)
    "phi3-longrope": ConvertedModel("phi3-fused", "llama-spm", {
        "max_position_embeddings": 8192, "original_max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                            "long_factor": [1.0 + i / 8 for i in range(32)],
                            "short_factor": [1.0 + i / 64 for i in range(32)]}}),
    "gemma2": ConvertedModel("gemma2-softcap-window", "gemma-spm",
                             {"tie_word_embeddings": True}),
    "gemma3": ConvertedModel("gemma3-local-global", "gemma-spm", {
        "tie_word_embeddings": True, "num_hidden_layers": 6, "layer_types": None,
        "sliding_window_pattern": 6}),
    "mixtral": ConvertedModel("mixtral-moe", "llama-spm"),
    "qwen3moe": ConvertedModel("qwen3-moe", "smollm2",
                               {"mlp_only_layers": [], "norm_topk_prob": True}),
}
SPM_STYLES = {
    # Gemma: pad 0, eos 1, bos 2, unk 3, no dummy prefix, turn markers as user symbols
    "gemma-spm": {"pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3, "pad_piece": "<pad>",
                  "eos_piece": "<eos>", "bos_piece": "<bos>", "unk_piece": "<unk>",
                  "add_dummy_prefix": False,
                  "user_defined_symbols": ["<start_of_turn>", "<end_of_turn>"]},
    # Llama/Phi-3: unk 0, bos 1, eos 2, a dummy prefix space
    "llama-spm": {"unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1,
                  "add_dummy_prefix": True},
}


@functools.cache
def llamacpp_converter() -> Path:
    """``convert_hf_to_gguf.py`` of the newest llama.cpp source unpacked in the cache, else
    of the newest release, unpacked now (skip when unreachable). Asking PyPI for the newest
    each time would cost seconds per test."""
    benchmarks_on_path()
    from harness.llamacpp import cache_root, llamacpp_source

    cached = sorted(cache_root().glob("src-*/llama.cpp/convert_hf_to_gguf.py"),
                    key=lambda path: path.stat().st_mtime)
    if cached:
        return cached[-1]
    try:
        _, source = llamacpp_source()
    except OSError as exc:
        pytest.skip(f"llama.cpp's converter is not reachable: {exc}")
    return source / "convert_hf_to_gguf.py"


@functools.cache
def _root() -> Path:
    """Fixed at first use: tests point ``$KVRELAY_CACHE_DIR`` at a temporary folder later."""
    benchmarks_on_path()
    from harness.llamacpp import cache_root

    return cache_root() / "test-gguf"


def _key(name: str, converter: Path) -> str:
    spec = CONVERTED[name]
    blob = json.dumps([VERSION, TINY_MODELS[spec.tiny], spec.tokenizer, spec.overrides,
                       converter.parent.parent.name], sort_keys=True, default=str)
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def train_spm(style: str) -> bytes:
    """A tiny BPE SentencePiece model (400 pieces, byte fallback) in ``style``."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CALIBRATION * 20), model_writer=model, vocab_size=400,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, minloglevel=2, **SPM_STYLES[style])
    return model.getvalue()


def save_spm_tokenizer(style: str, folder: Path) -> Any:
    """``tokenizer.model`` and the Hugging Face tokenizer transformers builds from it."""
    from transformers import GemmaTokenizer, LlamaTokenizer
    from transformers.tokenization_utils_sentencepiece import SentencePieceExtractor

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(train_spm(style))
    vocab, _, merges = SentencePieceExtractor(str(folder / "tokenizer.model")).extract()
    if style == "gemma-spm":
        tokenizer = GemmaTokenizer(vocab=vocab, merges=merges)
    else:
        tokenizer = LlamaTokenizer(vocab=vocab, merges=merges, unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def hf_folder(name: str, smollm2_tokenizer: Path | None) -> Path:
    """The tiny Hugging Face model ``name`` of ``CONVERTED``, built once into the cache."""
    converter = llamacpp_converter()
    folder = _root() / _key(name, converter) / "hf"
    if (folder / "model.safetensors").is_file():
        return folder
    spec = CONVERTED[name]
    overrides = copy.deepcopy(spec.overrides)  # transformers' configs mutate dicts they get
    tmp = folder.with_name("hf.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if spec.tokenizer == "smollm2":
        if smollm2_tokenizer is None:
            pytest.skip("needs SmolLM2's tokenizer")
        build_tiny_model(spec.tiny, tmp, tokenizer_folder=smollm2_tokenizer, **overrides)
    else:
        tokenizer = save_spm_tokenizer(spec.tokenizer, tmp)
        build_tiny_model(spec.tiny, tmp, vocab_size=len(tokenizer), **{
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id, **overrides})
    tmp.rename(folder)
    return folder


def converted_gguf(name: str, outtype: str, smollm2_tokenizer: Path | None) -> Path:
    """``name`` converted by llama.cpp (``outtype`` ``f32`` or ``q8_0``), made once."""
    converter = llamacpp_converter()
    folder = hf_folder(name, smollm2_tokenizer)
    out = folder.parent / f"{name}-{outtype}.gguf"
    if not out.is_file():
        tmp = out.with_suffix(".tmp")
        result = subprocess.run([sys.executable, str(converter), str(folder), "--outtype",
                                 outtype, "--outfile", str(tmp)], capture_output=True,
                                text=True)
        assert result.returncode == 0, result.stderr[-3000:]
        tmp.rename(out)
    return out
