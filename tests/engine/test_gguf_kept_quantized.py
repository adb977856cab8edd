"""GGUF models kept quantized: lossless repack of Q8_0/Q4_0/Q4_1 and the engine on it.

(Q5_0, Q5_1 and the K-quants: ``test_gguf_kquants_kept.py``.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from helpers.engine_run import one_torch_thread
from helpers.tiny_gguf import TINY_VOCAB_SIZE, write_gguf_from_hf
from helpers.tiny_models import build_tiny_model

from kvrelay_kernels import cpu_quantized_matmul
from kvrelay_kernels.reference.quantized_matmul import dequantize_weight
from kvrelay_worker.engine.llm import LLM
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.loading import cache_layout
from kvrelay_worker.loading.gguf_blocks import repack_blocks
from kvrelay_worker.loading.gguf_storage import gguf_storage
from kvrelay_worker.models.quantize_model import weight_bytes
from kvrelay_worker.models.quantized_linear import QuantizedEmbedding, QuantizedLinear
from kvrelay_worker.teacher_forcing import sequence_logits

Q = gguf.GGMLQuantizationType
PROMPT = [(29 * i + 5) % (TINY_VOCAB_SIZE - 10) + 3 for i in range(30)]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_repack_dequantizes_to_the_gguf_bits(qtype: gguf.GGMLQuantizationType) -> None:
    rng = np.random.default_rng(0)
    values = (rng.standard_normal((48, 160)) * rng.uniform(0.01, 3, (48, 1))).astype(np.float32)
    blocks = gguf.quants.quantize(values, qtype)
    packed = repack_blocks(blocks, qtype, 160)
    assert packed is not None
    expected = torch.from_numpy(gguf.quants.dequantize(blocks, qtype).astype(np.float32))
    assert torch.equal(dequantize_weight(packed), expected)
    # the file's bytes per weight (float16 scales and minimums kept); Q4_0 adds a minimum
    extra = 2 * packed.scales.numel() if qtype == Q.Q4_0 else 0
    assert packed.nbytes == blocks.nbytes + extra


def test_types_without_a_lossless_repack_say_so() -> None:
    assert repack_blocks(np.zeros((2, 110), np.uint8), Q.Q3_K, 256) is None


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    root = tmp_path_factory.mktemp("tiny-gguf-quant")

    def get(name: str, qtype: gguf.GGMLQuantizationType) -> Path:
        folder = build_tiny_model(name, root / name, vocab_size=TINY_VOCAB_SIZE)
        return write_gguf_from_hf(folder, root / f"{name}-{qtype.name}.gguf", qtype)

    return get


@pytest.fixture
def weight_only_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """The integer dot-product and GEMM kernels also round activations (their own tests
    bound that); off here, so that logits can be compared to float rounding."""
    monkeypatch.setattr(cpu_quantized_matmul, "INTEGER_DOT_MAX_ROWS", {8: 0, 4: 0})
    monkeypatch.setenv("KVRELAY_CPU_INT16_GEMM", "0")


@pytest.mark.usefixtures("weight_only_products")
@pytest.mark.parametrize(("name", "qtype"), [("llama-mha-untied", Q.Q4_1),
                                             ("qwen2-gqa-bias-tied", Q.Q8_0),
                                             ("llama-mqa", Q.Q4_0)])
def test_kept_quantized_engine_matches_the_dequantised_one(
        name: str, qtype: gguf.GGMLQuantizationType, tiny_gguf: Callable[..., Path],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same weights, only the summation order differs: logits agree to float rounding."""
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path / "cache"))
    path = tiny_gguf(name, qtype)

    def make(quantization: str) -> LLM:
        return LLM(str(path), device="cpu", dtype="float32", num_kv_blocks=8,
                   max_num_seqs=2, enable_prefix_caching=False, quantization=quantization)

    kept, dequantised = make("gguf"), make("none")
    model = kept.engine.model
    assert isinstance(model.layers[0].self_attn.qkv_proj, QuantizedLinear)
    assert isinstance(model.layers[0].mlp.gate_up_proj, QuantizedLinear)
    assert isinstance(model.lm_head, QuantizedLinear)
    assert isinstance(model.embed_tokens, QuantizedEmbedding)
    # what `kvrelay models` predicts from the tensor headers is what is resident
    assert gguf_storage(path).kept_quantized_bytes == weight_bytes(model)
    expected = sequence_logits(dequantised.engine, PROMPT)
    torch.testing.assert_close(sequence_logits(kept.engine, PROMPT), expected,
                               rtol=1e-4, atol=1e-4)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    assert (kept.generate([PROMPT[:7]], params)[0].choices[0].token_ids
            == dequantised.generate([PROMPT[:7]], params)[0].choices[0].token_ids)


def test_kept_quantized_engine_with_the_integer_kernel(
        tiny_gguf: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The integer dot-product kernel (batch-1 decode's, here given every product) moves
    the logits away from the weight-only ones by the activations' int16 rounding, and by
    no more than that (``benchmarks/quality.py`` measures SmolLM2's agreement)."""
    if not cpu_quantized_matmul.load_cpu_kernels():
        pytest.skip("no C++ compiler here")
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path / "cache"))
    path = tiny_gguf("llama-mha-untied", Q.Q4_1)
    kept = LLM(str(path), device="cpu", dtype="float32", num_kv_blocks=8, max_num_seqs=2,
               enable_prefix_caching=False, quantization="gguf")
    monkeypatch.setattr(cpu_quantized_matmul, "INTEGER_DOT_MAX_ROWS", {8: 1 << 20, 4: 1 << 20})
    got = sequence_logits(kept.engine, PROMPT)
    monkeypatch.setattr(cpu_quantized_matmul, "INTEGER_DOT_MAX_ROWS", {8: 0, 4: 0})
    monkeypatch.setenv("KVRELAY_CPU_INT16_GEMM", "0")
    weight_only = sequence_logits(kept.engine, PROMPT)
    difference = (got - weight_only).abs()
    assert difference.max() > 1e-4  # the kernel ran: 5e-3 when measured
    assert difference.max() < 0.02
    assert difference.mean() < 2e-3  # 6e-4 when measured
