"""GGUF Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1 kept quantized: bit-exact repack, every backend.

The oracle is ``gguf.quants.dequantize`` of the very bytes repacked. Q5_0/Q5_1 bytes come
from ``gguf.quants.quantize``; the package cannot quantize the K-quants, so their bytes are
random blocks whose float16 fields are finite (``helpers.kquant_blocks``: any such byte
pattern is a valid block). Each backend's product is compared with a float64 product of
the oracle's weights: the reference and the dequantizing kernels (CPU tiles, Triton in
the interpreter) to float32 rounding; the CPU integer kernel, which also rounds the
activations to int16 per block of 32, to that rounding (computed here exactly, as in
``tests/kernels/test_cpu_quantized_linear.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from helpers.engine_run import one_torch_thread
from helpers.kquant_blocks import K_QUANTS, k_quant_blocks, typed_by_layer, write_typed_gguf
from helpers.tiny_gguf import TINY_VOCAB_SIZE

from kvrelay_kernels import cpu_quantized_matmul
from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
from kvrelay_kernels.quantized_matmul import quantized_matmul
from kvrelay_kernels.quantized_weight import QuantizedWeight
from kvrelay_kernels.reference.quantized_matmul import dequantize_weight
from kvrelay_worker.engine.llm import LLM
from kvrelay_worker.loading import cache_layout
from kvrelay_worker.loading.gguf_blocks import KEPT_LAYOUTS, kept_bytes, repack_blocks
from kvrelay_worker.loading.gguf_storage import gguf_storage
from kvrelay_worker.models.quantize_model import weight_bytes
from kvrelay_worker.models.quantized_linear import QuantizedEmbedding, QuantizedLinear
from kvrelay_worker.teacher_forcing import sequence_logits

Q = gguf.GGMLQuantizationType
NEW_TYPES = (Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K)
ROWS, K = 40, 768  # three super-blocks per row; K/2 = 384 is whole 32-input blocks


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def stored_blocks(qtype: gguf.GGMLQuantizationType, seed: int, *, wild: bool = False,
                  rows: int = ROWS, k: int = K) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if qtype in K_QUANTS:
        return k_quant_blocks(qtype, rows, k, rng, std=1.0, wild=wild)
    scale = rng.uniform(1e-3, 1e3 if wild else 3.0, (rows, 1))
    return gguf.quants.quantize((rng.standard_normal((rows, k)) * scale).astype(np.float32),
                                qtype)


def oracle(blocks: np.ndarray, qtype: gguf.GGMLQuantizationType) -> torch.Tensor:
    return torch.from_numpy(np.asarray(gguf.quants.dequantize(blocks, qtype), np.float32))


def repacked(blocks: np.ndarray, qtype: gguf.GGMLQuantizationType,
             k: int = K) -> QuantizedWeight:
    weight = repack_blocks(blocks, qtype, k)
    assert weight is not None
    weight.check()
    return weight


@pytest.mark.parametrize("wild", [False, True])
@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
def test_repack_dequantizes_to_the_gguf_bits(qtype: gguf.GGMLQuantizationType,
                                             wild: bool) -> None:
    """Bit for bit (signed zeros included), for blocks of any finite scale."""
    blocks = stored_blocks(qtype, 1, wild=wild)
    weight = repacked(blocks, qtype)
    layout = KEPT_LAYOUTS[qtype.name]
    assert (weight.bits, weight.group_size, weight.mins is not None) == (
        layout.bits, layout.group_size, layout.mins)
    assert weight.scales.element_size() == layout.scale_bytes
    got, expected = dequantize_weight(weight), oracle(blocks, qtype)
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
    assert weight.nbytes == kept_bytes(qtype.name, ROWS * K)


def test_q4_k_keeps_four_bits_per_weight() -> None:
    """Q4_K stays int4 (plus a float32 scale and minimum per 32: 6 bits per weight)."""
    weight = repacked(stored_blocks(Q.Q4_K, 2), Q.Q4_K)
    assert weight.bits == 4
    assert weight.nbytes * 8 / (ROWS * K) == 6.0


def exact_product(x: torch.Tensor, blocks: np.ndarray,
                  qtype: gguf.GGMLQuantizationType) -> torch.Tensor:
    return x.double() @ oracle(blocks, qtype).double().T


def relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got.double() - exact).abs().max() / exact.abs().max())


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
def test_reference_backend(qtype: gguf.GGMLQuantizationType,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVRELAY_KERNELS", "reference")
    blocks = stored_blocks(qtype, 3)
    x = torch.randn(5, K)
    assert relative_error(quantized_matmul(x, repacked(blocks, qtype)),
                          exact_product(x, blocks, qtype)) < 1e-6


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
def test_triton_backend(qtype: gguf.GGMLQuantizationType,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU tensors under ``TRITON_INTERPRET=1`` (set by the root conftest)."""
    monkeypatch.setenv("KVRELAY_KERNELS", "triton")
    blocks = stored_blocks(qtype, 4)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    weight = repacked(blocks, qtype).to(torch.device(device))
    x = torch.randn(3, K)
    bias = torch.randn(ROWS)
    got = quantized_matmul(x.to(device), weight, bias.to(device)).cpu()
    assert relative_error(got, exact_product(x, blocks, qtype) + bias.double()) < 1e-5


cpu_kernels = pytest.mark.skipif(not load_cpu_kernels(), reason="no C++ compiler here")


def int16_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the integer kernel rounds it: int16 steps of amax / 32767 per block of 32."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 32767
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return (torch.round(blocks * inverse).double() * d.double()).reshape(x.shape)


@cpu_kernels
@pytest.mark.parametrize("rows", [1, 3, 4, 6])
@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
def test_cpu_integer_kernel(qtype: gguf.GGMLQuantizationType, rows: int) -> None:
    """The exact product of the int16-rounded activations with the oracle's weights; the
    minimums multiply the exact activation sums."""
    blocks = stored_blocks(qtype, 5 + rows)
    weight = repacked(blocks, qtype)
    x = torch.randn(rows, K)
    got = torch.ops.kvrelay_cpu.quantized_linear(x, weight.qweight, weight.scales, weight.mins,
                                                 weight.bits, weight.group_size, None)
    w = oracle(blocks, qtype).double()
    if weight.mins is None:
        expected = int16_activations(x) @ w.T
    else:
        mins = weight.mins.double().repeat_interleave(weight.group_size, dim=1)
        expected = int16_activations(x) @ (w - mins).T + x.double() @ mins.T
    assert relative_error(got, expected) < 1e-6
    assert relative_error(got, exact_product(x, blocks, qtype)) < 3e-4


@cpu_kernels
@pytest.mark.parametrize("rows", [1, 7, 70])  # tiles; from 64 rows the whole matrix
@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
def test_cpu_dequantized_tiles_kernel(qtype: gguf.GGMLQuantizationType, rows: int) -> None:
    blocks = stored_blocks(qtype, 6)
    weight = repacked(blocks, qtype)
    x = torch.randn(rows, K)
    bias = torch.randn(ROWS)
    got = torch.ops.kvrelay_cpu.dequantized_linear(x, weight.qweight, weight.scales,
                                                   weight.mins, weight.bits,
                                                   weight.group_size, bias)
    assert relative_error(got, exact_product(x, blocks, qtype) + bias.double()) < 1e-6


@cpu_kernels
@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
def test_public_entry_point_takes_the_cpu_kernels(qtype: gguf.GGMLQuantizationType) -> None:
    """Batch-1 decode takes the integer kernel (group 16 included); more rows the integer
    GEMM where this level has one, except Q6_K's groups of 16, which take the tiles."""
    weight = repacked(stored_blocks(qtype, 7), qtype)
    one, many = torch.randn(1, K), torch.randn(40, K)
    assert cpu_quantized_matmul.integer_dot_serves(1, weight)
    direct = torch.ops.kvrelay_cpu.quantized_linear(one, weight.qweight, weight.scales,
                                                    weight.mins, weight.bits,
                                                    weight.group_size, None)
    assert torch.equal(quantized_matmul(one, weight), direct)
    assert not cpu_quantized_matmul.integer_dot_serves(40, weight)
    gemm = torch.ops.kvrelay_cpu.int16_gemm_lanes() > 0 and weight.group_size % 32 == 0
    assert cpu_quantized_matmul.int16_gemm_serves(weight) == gemm
    if gemm:
        values, scales, mins = cpu_quantized_matmul.int16_gemm_pack(weight)
        expected = torch.ops.kvrelay_cpu.int16_gemm(many, values, scales, mins,
                                                    weight.out_features, None)
    else:
        expected = torch.ops.kvrelay_cpu.dequantized_linear(many, weight.qweight, weight.scales,
                                                            weight.mins, weight.bits,
                                                            weight.group_size, None)
    assert torch.equal(quantized_matmul(many, weight), expected)


# One type per fused layer (mixed fused layers: further down); both layers differ.
LAYER_TYPES = [
    {"attn_q": Q.Q5_K, "attn_k": Q.Q5_K, "attn_v": Q.Q5_K, "attn_output": Q.Q6_K,
     "ffn_gate": Q.Q4_K, "ffn_up": Q.Q4_K, "ffn_down": Q.Q5_1},
    {"attn_q": Q.Q5_0, "attn_k": Q.Q5_0, "attn_v": Q.Q5_0, "attn_output": Q.Q4_K,
     "ffn_gate": Q.Q6_K, "ffn_up": Q.Q6_K, "ffn_down": Q.Q5_K},
]


_tensor_type = typed_by_layer(LAYER_TYPES)


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_typed_gguf(tmp_path_factory.mktemp("kquant-gguf"), _tensor_type)


def loaded_formats(path: Path, caplog: pytest.LogCaptureFixture) -> tuple[LLM, str]:
    """The model kept quantized, and its load log line naming each type's fate."""
    with caplog.at_level(logging.INFO, logger="kvrelay_worker.engine.engine_model"):
        llm = LLM(str(path), device="cpu", dtype="float32", num_kv_blocks=8, max_num_seqs=2,
                  enable_prefix_caching=False, quantization="gguf")
    loaded = [r.getMessage() for r in caplog.records if "kept from GGUF" in r.getMessage()]
    assert len(loaded) == 1
    return llm, loaded[0]


def test_kept_k_quants_load_and_match_the_dequantised_model(
        mixed_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Every matrix kept (no float weight for any), reported as repacked, and the logits
    those of the float model built from ``gguf.quants.dequantize`` (``quantization="none"``)
    to 1e-3 relative, with the weight-only CPU kernels (the tiles)."""
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_quantized_matmul, "INTEGER_DOT_MAX_ROWS", {8: 0, 4: 0})

    kept, log_line = loaded_formats(mixed_gguf, caplog)
    assert "repacked" in log_line
    assert "requantized" not in log_line
    dequantised = LLM(str(mixed_gguf), device="cpu", dtype="float32", num_kv_blocks=8,
                      max_num_seqs=2, enable_prefix_caching=False, quantization="none")
    model = kept.engine.model
    matrices = [model.get_submodule(f"layers.{i}.{path}") for i in range(2)
                for path in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                             "mlp.down_proj")]
    assert all(isinstance(m, QuantizedLinear) for m in matrices)
    assert isinstance(model.embed_tokens, QuantizedEmbedding)
    assert isinstance(model.lm_head, QuantizedLinear)
    assert [(m.bits, m.group_size) for m in matrices[2::4]] == [(4, 32), (8, 16)]  # Q4_K, Q6_K
    floats = [name for name, p in model.named_parameters() if p.dim() == 2]
    assert floats == []
    storage = gguf_storage(mixed_gguf)
    assert storage.requantized_types == []
    assert storage.kept_quantized_bytes == weight_bytes(model)
    prompt = [(29 * i + 5) % (TINY_VOCAB_SIZE - 10) + 3 for i in range(30)]
    expected = sequence_logits(dequantised.engine, prompt)
    got = sequence_logits(kept.engine, prompt)
    assert relative_error(got, expected.double()) < 1e-3


def test_storage_report_names_the_requantized_types(tmp_path: Path) -> None:
    """``kvrelay models`` says which stored types lose bits (Q3_K here), not the kept ones."""
    from kvrelay.cli.models import _storage_json, _storage_line

    rng = np.random.default_rng(9)
    raw = rng.integers(0, 256, (4, 110), dtype=np.uint8)  # Q3_K: d is its last 2 bytes
    raw[:, 108:110] = np.full((4, 1), 0.01, np.float16).view(np.uint8)
    path = tmp_path / "mixed.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=Q.Q3_K)
    writer.add_tensor("blk.0.attn_k.weight", k_quant_blocks(Q.Q4_K, 4, 256, rng),
                      raw_dtype=Q.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    storage = gguf_storage(path)
    assert storage.requantized_types == ["Q3_K"]
    # Q3_K requantized to int4 with float16 scale and minimum; Q4_K kept
    assert storage.kept_quantized_bytes == 1024 // 2 + 1024 // 32 * 4 + kept_bytes("Q4_K", 1024)
    assert "Q3_K requantized, not bit-exact" in _storage_line(path)
    assert _storage_json(path)["requantized_types"] == ["Q3_K"]


@pytest.mark.parametrize("backend", ["reference", "cpu-tiles", "triton"])
@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
def test_products_with_the_identity_give_the_gguf_bits(qtype: gguf.GGMLQuantizationType,
                                                       backend: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``I @ W.T`` is ``W.T`` exactly when a backend dequantizes to the oracle's bits (every
    other term of each sum is an exact zero): the dequantizing backends do. 48 rows take
    the CPU tiles, all K rows its whole-matrix path."""
    if backend == "cpu-tiles" and not load_cpu_kernels():
        pytest.skip("no C++ compiler here")
    monkeypatch.setenv("KVRELAY_KERNELS", "triton" if backend == "triton" else "reference")
    blocks = stored_blocks(qtype, 10, rows=16, k=256)
    weight = repacked(blocks, qtype, 256)
    expected = oracle(blocks, qtype).T
    for rows in (48, 256):
        x = torch.eye(256)[:rows]
        if backend == "cpu-tiles":
            got = torch.ops.kvrelay_cpu.dequantized_linear(x, weight.qweight, weight.scales,
                                                           weight.mins, weight.bits,
                                                           weight.group_size, None)
        else:
            got = quantized_matmul(x, weight)
        assert torch.equal(got, expected[:rows])
