"""GGUF files of Gemma 2/3, Phi-3, Mixtral and Qwen3-MoE, as llama.cpp's converter writes them.

Each tiny random model (``helpers.llamacpp_gguf``) is converted by llama.cpp's own
``convert_hf_to_gguf.py`` to F32 and Q8_0. Checked against independent oracles:

- the config read from the file equals the one the family reads from the original
  ``config.json``, and survives the ``config.json`` the float path writes;
- F32 logits (float path) equal transformers' on the original model to 1e-3 of the
  largest logit, greedy tokens identical; transformers reads the converted folder the
  float path writes (config.json and tensor names) into the same model;
- Q8_0 kept quantized equals the same file dequantized by the ``gguf`` package, to 1e-3,
  with no float weight in any linear layer but the MoE routers (float in the file), the
  experts' included;
- the tokenizer built from the file encodes as the original Hugging Face tokenizer does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from helpers.engine_run import one_torch_thread
from helpers.hf_reference import hf_greedy, load_hf_model
from helpers.llamacpp_gguf import CONVERTED, converted_gguf
from torch import nn
from transformers import AutoTokenizer

from kvrelay_kernels import cpu_quantized_matmul
from kvrelay_worker.engine.llm import LLM
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.loading import cache_layout
from kvrelay_worker.loading.gguf_file import GGUFCheckpoint
from kvrelay_worker.loading.gguf_metadata import GGUFFile
from kvrelay_worker.loading.gguf_storage import gguf_storage
from kvrelay_worker.loading.hf_folder import (
    config_from_hf_dict,
    hf_dict_from_config,
    read_hf_config,
)
from kvrelay_worker.loading.tokenizer import gguf_fast_tokenizer, load_tokenizer
from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.models.moe import SparseMoE
from kvrelay_worker.models.quantize_model import weight_bytes
from kvrelay_worker.models.quantized_linear import QuantizedEmbedding, QuantizedLinear
from kvrelay_worker.teacher_forcing import sequence_logits

NAMES = tuple(CONVERTED)
RUNNABLE = tuple(name for name in NAMES if name != "phi3-longrope")  # no longrope tables
TOLERANCE = 1e-3  # of the largest |logit|, per prompt
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.",
         "def add(a, b):\n    return a + b", "Paris  is 12 km away", ""]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def gguf(request: pytest.FixtureRequest) -> Callable[[str, str], Path]:
    """``gguf(name, outtype)``: the converted file (SmolLM2's tokenizer only if needed)."""

    def get(name: str, outtype: str) -> Path:
        smollm2 = None
        if CONVERTED[name].tokenizer == "smollm2":
            smollm2 = request.getfixturevalue("tokenizer_folder")
        return converted_gguf(name, outtype, smollm2)

    return get


def prompts(vocab: int) -> list[list[int]]:
    """Two prompts past every window of the models (40 and 36 tokens), no special ids."""
    low = 8
    return [[(37 * i + 11) % (vocab - low) + low for i in range(70)],
            [(101 * i + 5) % (vocab - low) + low for i in range(45)]]


def engine(path: Path, quantization: str) -> LLM:
    return LLM(str(path), device="cpu", dtype="float32", num_kv_blocks=16, max_num_seqs=2,
               enable_prefix_caching=False, quantization=quantization)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).abs().max() / expected.abs().max())


@pytest.mark.parametrize("name", NAMES)
def test_config_read_from_the_file_equals_the_hf_config(
        name: str, gguf: Callable[[str, str], Path]) -> None:
    path = gguf(name, "q8_0")
    config = GGUFCheckpoint(path).config
    assert config == read_hf_config(path.parent / "hf")  # every field but ``extra``
    assert config_from_hf_dict(hf_dict_from_config(config)) == config


def test_phi3_long_rope_is_read_and_refused_by_name(gguf: Callable[[str, str], Path],
                                                    tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp keeps Phi-3's long-context factors as tensors; they become HF's longrope,
    which the engine's RoPE tables do not implement: refused, not run wrong."""
    path = gguf("phi3-longrope", "q8_0")
    scaling = GGUFCheckpoint(path).config.rope_scaling
    assert scaling is not None
    assert scaling["rope_type"] == "longrope"
    assert scaling["long_factor"][:3] == [1.0, 1.125, 1.25]
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path))
    with pytest.raises(UnsupportedModelError, match="longrope"):
        engine(path, "gguf")


@pytest.mark.parametrize("name", RUNNABLE)
def test_f32_file_matches_transformers(name: str, gguf: Callable[[str, str], Path],
                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = gguf(name, "f32")
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path))
    llm = engine(path, "none")
    hf = load_hf_model(path.parent / "hf")
    (converted,) = [p.parent for p in tmp_path.glob("models/*/config.json")]
    hf_converted = load_hf_model(converted)  # transformers reads what the float path wrote
    for prompt in prompts(llm.engine.model.config.vocab_size):
        got = sequence_logits(llm.engine, prompt)
        with torch.no_grad():
            expected = hf(torch.tensor([prompt])).logits[0].float()
            again = hf_converted(torch.tensor([prompt])).logits[0].float()
        assert relative_error(got, expected) < TOLERANCE
        assert relative_error(again, expected) < TOLERANCE
    short = [p[:12] for p in prompts(llm.engine.model.config.vocab_size)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    ours = [out.choices[0].token_ids for out in llm.generate(short, params)]
    assert ours == hf_greedy(hf, short, 8)


@pytest.fixture
def weight_only_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """The integer dot-product kernel also rounds activations (its own tests bound that)."""
    monkeypatch.setattr(cpu_quantized_matmul, "INTEGER_DOT_MAX_ROWS", {8: 0, 4: 0})


@pytest.mark.usefixtures("weight_only_products")
@pytest.mark.parametrize("name", RUNNABLE)
def test_q8_0_kept_quantized_matches_the_dequantized_file(
        name: str, gguf: Callable[[str, str], Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = gguf(name, "q8_0")
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path))
    kept = engine(path, "gguf")
    model = kept.engine.model
    float_linears = [n for n, m in model.named_modules()
                     if isinstance(m, nn.Linear) and not n.endswith("mlp.gate")]
    assert float_linears == []  # only MoE routers (float in the file) stay nn.Linear
    assert isinstance(model.embed_tokens, QuantizedEmbedding)
    assert isinstance(model.lm_head, QuantizedLinear)
    for layer in model.layers:
        assert isinstance(layer.self_attn.qkv_proj, QuantizedLinear)
        assert isinstance(layer.self_attn.o_proj, QuantizedLinear)
        if isinstance(layer.mlp, SparseMoE):
            assert layer.mlp.quantized_w13 is not None
            assert layer.mlp.quantized_w2 is not None
            assert all(isinstance(m, QuantizedLinear) for m in [*layer.mlp.quantized_w13,
                                                                *layer.mlp.quantized_w2])
        else:
            assert isinstance(layer.mlp.gate_up_proj, QuantizedLinear)
            assert isinstance(layer.mlp.down_proj, QuantizedLinear)
    matrices = [n for n, p in model.named_parameters() if p.dim() > 1]
    assert [n for n in matrices if not n.endswith("mlp.gate.weight")] == []
    assert gguf_storage(path).kept_quantized_bytes == weight_bytes(model)
    dequantized = engine(path, "none")
    for prompt in prompts(model.config.vocab_size):
        got = sequence_logits(kept.engine, prompt)
        assert relative_error(got, sequence_logits(dequantized.engine, prompt)) < TOLERANCE


@pytest.mark.parametrize("name", RUNNABLE)
def test_tokenizer_from_the_file_encodes_as_the_original(
        name: str, gguf: Callable[[str, str], Path]) -> None:
    """Built from our parsed header as transformers builds it from the file, and encoding
    as the original Hugging Face tokenizer (and the SentencePiece model itself) does."""
    path = gguf(name, "q8_0")
    ours = gguf_fast_tokenizer(GGUFFile(path))
    assert ours is not None  # the fast path, not transformers' re-read of the file
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert type(ours) is type(reference)
    assert ours.backend_tokenizer.to_str() == reference.backend_tokenizer.to_str()
    assert ours.special_tokens_map == reference.special_tokens_map
    assert ours.add_bos_token == reference.add_bos_token
    original = AutoTokenizer.from_pretrained(str(path.parent / "hf"))
    spm = None
    if (path.parent / "hf" / "tokenizer.model").is_file():  # the trained model itself
        import sentencepiece

        spm = sentencepiece.SentencePieceProcessor(
            model_file=str(path.parent / "hf" / "tokenizer.model"))
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == original.encode(text, add_special_tokens=False), text
        assert spm is None or ids == spm.encode(text), text
        assert ours.decode(ids) == original.decode(ids), text
    assert load_tokenizer(path).encode(TEXTS[1]) == ours.encode(TEXTS[1])


@pytest.mark.parametrize("arch", ["llama", "qwen3moe"])
def test_a_window_the_family_cannot_express_is_refused(arch: str, tmp_path: Path) -> None:
    """Only Gemma and Phi-3 read ``attention.sliding_window``; elsewhere it is refused,
    never ignored (headers only: no tensor beyond the embedding is needed to get there)."""
    import gguf as gguf_package
    import numpy as np

    path = tmp_path / f"{arch}.gguf"
    writer = gguf_package.GGUFWriter(str(path), arch)
    for key, value in (("block_count", 1), ("context_length", 4096),
                       ("embedding_length", 16), ("feed_forward_length", 32),
                       ("attention.head_count", 2), ("attention.sliding_window", 32)):
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 16), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        GGUFCheckpoint(path)
