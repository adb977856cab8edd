"""Fused projections whose GGUF shards mix types stay quantized: one kept matrix per layout.

llama.cpp's ``Q4_K_M`` stores ``attn_v`` (and some layers' ``ffn_down``) as Q6_K beside
Q4_K ``attn_q``/``attn_k``; on models whose widths are not multiples of 256 (SmolLM2) the
same recipe falls back to Q5_0 q/k beside Q8_0 v. The engine fuses q|k|v and gate|up:
shards of one layout are concatenated (Q5_0 and Q8_0 are both int8 with float16 scales per
32), shards of different layouts become a ``FusedQuantizedLinear`` whose parts run on their
own kept weights. The oracle is the float model built from ``gguf.quants.dequantize``
(``quantization="none"`` on the same file).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.engine_run import assert_engine_idle, final_outputs, one_torch_thread, run_engine
from helpers.kquant_blocks import k_quant_blocks, typed_by_layer, write_typed_gguf
from helpers.lora_adapters import make_peft_adapter
from helpers.tiny_gguf import TINY_VOCAB_SIZE

from kvrelay_kernels import cpu_quantized_matmul
from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
from kvrelay_kernels.quantized_weight import QuantizedWeight
from kvrelay_kernels.reference.quantized_matmul import dequantize_weight
from kvrelay_worker import SamplingParams
from kvrelay_worker.engine import EngineConfig, LLMEngine
from kvrelay_worker.engine.llm import LLM
from kvrelay_worker.loading import cache_layout
from kvrelay_worker.loading.gguf_blocks import repack_blocks
from kvrelay_worker.loading.gguf_storage import gguf_storage
from kvrelay_worker.models.lora_linear import LoraLinear
from kvrelay_worker.models.quantize_model import weight_bytes
from kvrelay_worker.models.quantized_linear import FusedQuantizedLinear, QuantizedLinear
from kvrelay_worker.teacher_forcing import sequence_logits

Q = gguf.GGMLQuantizationType
# Layer 0: Q4_K_M's Q6_K attn_v and ffn_down, and a gate/up mix (Q4_K, Q6_K) too.
# Layer 1: the Q5_0 q/k beside Q8_0 v of the fallback (one layout: one matrix), and a
# gate/up of Q5_K (int8 with minimums) beside Q4_K.
LAYER_TYPES = [
    {"attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q6_K, "attn_output": Q.Q4_K,
     "ffn_gate": Q.Q4_K, "ffn_up": Q.Q6_K, "ffn_down": Q.Q6_K},
    {"attn_q": Q.Q5_0, "attn_k": Q.Q5_0, "attn_v": Q.Q8_0, "attn_output": Q.Q5_0,
     "ffn_gate": Q.Q5_K, "ffn_up": Q.Q4_K, "ffn_down": Q.Q4_K},
]
MODELS = ["llama3-rope", "qwen2-gqa-bias-tied"]  # the second: q/k/v biases, tied head
PROMPT = [(29 * i + 5) % (TINY_VOCAB_SIZE - 10) + 3 for i in range(30)]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


_tensor_type = typed_by_layer(LAYER_TYPES)


@pytest.fixture(scope="module", params=MODELS)
def mixed_gguf(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"mixed-{request.param}")
    return write_typed_gguf(root, _tensor_type, model=request.param)


@pytest.fixture
def weight_only_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off: the integer kernels' int16 activations (their own tests bound that rounding)."""
    monkeypatch.setattr(cpu_quantized_matmul, "INTEGER_DOT_MAX_ROWS", {8: 0, 4: 0})
    monkeypatch.setenv("KVRELAY_CPU_INT16_GEMM", "0")


def _llm(path: Path, quantization: str) -> LLM:
    return LLM(str(path), device="cpu", dtype="float32", num_kv_blocks=16, max_num_seqs=2,
               enable_prefix_caching=False, quantization=quantization)


def _layouts(module: torch.nn.Module) -> list[tuple[int, int, bool]]:
    parts = module.parts if isinstance(module, FusedQuantizedLinear) else [module]
    return [(p.bits, p.group_size, p.mins is not None) for p in parts]


def relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got.double() - exact.double()).abs().max() / exact.double().abs().max())


@pytest.mark.usefixtures("weight_only_products")
def test_mixed_fused_layers_stay_kept_and_match_the_dequantised_model(
        mixed_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """No float weight, every shard reported repacked, the bytes ``kvrelay models``
    predicts, and the dequantised model's logits (1e-3 relative) and greedy tokens."""
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO, logger="kvrelay_worker.engine.engine_model"):
        kept = _llm(mixed_gguf, "gguf")
    lines = [r.getMessage() for r in caplog.records if "kept from GGUF" in r.getMessage()]
    assert len(lines) == 1
    assert "requantized" not in lines[0]
    assert "3 fused layers of mixed types run per shard type" in lines[0]
    model = kept.engine.model
    layer0, layer1 = model.layers[0], model.layers[1]
    int4, q6_k, int8, q5_k = (4, 32, True), (8, 16, False), (8, 32, False), (8, 32, True)
    assert isinstance(layer0.self_attn.qkv_proj, FusedQuantizedLinear)
    assert _layouts(layer0.self_attn.qkv_proj) == [int4, q6_k]  # q|k, then v
    config = model.config
    assert layer0.self_attn.qkv_proj.columns == [
        (0, config.q_size + config.kv_size),
        (config.q_size + config.kv_size, config.q_size + 2 * config.kv_size)]
    assert isinstance(layer0.mlp.gate_up_proj, FusedQuantizedLinear)
    assert _layouts(layer0.mlp.gate_up_proj) == [int4, q6_k]
    assert isinstance(layer1.self_attn.qkv_proj, QuantizedLinear)  # Q5_0|Q5_0|Q8_0
    assert _layouts(layer1.self_attn.qkv_proj) == [int8]
    assert _layouts(layer1.mlp.gate_up_proj) == [q5_k, int4]
    assert [name for name, p in model.named_parameters() if p.dim() == 2] == []
    bias = layer0.self_attn.qkv_proj.bias
    assert (bias is not None) == ("qwen2" in mixed_gguf.parent.name)
    if bias is not None:  # the biases' shards reached the fused layer
        assert bool(bias.abs().min() > 0)
    storage = gguf_storage(mixed_gguf)
    assert storage.requantized_types == []
    assert storage.kept_quantized_bytes == weight_bytes(model)

    dequantised = _llm(mixed_gguf, "none")
    expected = sequence_logits(dequantised.engine, PROMPT)
    assert relative_error(sequence_logits(kept.engine, PROMPT), expected) < 1e-3
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = [PROMPT[:7], PROMPT[3:20]]  # batched: prefill, then two-row decode steps
    got = [out.choices[0].token_ids for out in kept.generate(prompts, params)]
    assert got == [out.choices[0].token_ids for out in dequantised.generate(prompts, params)]
    assert all(len(tokens) == 8 for tokens in got)


@pytest.mark.skipif(not load_cpu_kernels(), reason="no C++ compiler here")
def test_batch_one_decode_takes_the_integer_kernel_on_each_part(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy decoding of one request (every decode step one row: the integer kernel for
    Q4_K and for Q6_K's groups of 16) gives the tokens of the dequantised model."""
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path / "cache"))
    path = write_typed_gguf(tmp_path, _tensor_type)
    kept, dequantised = _llm(path, "gguf"), _llm(path, "none")
    calls: list[tuple[int, int]] = []
    integer_dot_serves = cpu_quantized_matmul.integer_dot_serves

    def spy(rows: int, weight: QuantizedWeight) -> bool:
        served = integer_dot_serves(rows, weight)
        if served:
            calls.append((weight.bits, weight.group_size))
        return served

    monkeypatch.setattr(cpu_quantized_matmul, "integer_dot_serves", spy)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    got = kept.generate([PROMPT[:9]], params)[0].choices[0].token_ids
    assert got == dequantised.generate([PROMPT[:9]], params)[0].choices[0].token_ids
    assert {(4, 32), (8, 16)} <= set(calls)


def _weights(rng: np.random.Generator, k: int = 256
             ) -> tuple[list[QuantizedWeight], torch.Tensor]:
    """Three parts (Q4_K, Q6_K, Q4_K: the runs need not be two) and their float rows."""
    parts, floats = [], []
    for rows, qtype in ((48, Q.Q4_K), (16, Q.Q6_K), (16, Q.Q4_K)):
        blocks = k_quant_blocks(qtype, rows, k, rng, std=1.0)
        weight = repack_blocks(blocks, qtype, k)
        assert weight is not None
        parts.append(weight)
        floats.append(torch.from_numpy(np.asarray(gguf.quants.dequantize(blocks, qtype),
                                                  np.float32)))
    return parts, torch.cat(floats)


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_fused_quantized_linear_is_the_product_with_the_stacked_rows(
        backend: str, rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each backend's product, bias included, equals the float product with the parts'
    dequantised rows stacked (the CPU integer kernel: to its int16 activations' rounding)."""
    if backend == "cpu" and not load_cpu_kernels():
        pytest.skip("no C++ compiler here")
    if backend == "cpu":
        monkeypatch.delenv("KVRELAY_KERNELS", raising=False)
    else:
        monkeypatch.setenv("KVRELAY_KERNELS", backend)
    parts, stacked = _weights(np.random.default_rng(rows))
    bias = torch.randn(stacked.shape[0])
    device = torch.device("cuda" if backend == "triton" and torch.cuda.is_available()
                          else "cpu")
    layer = FusedQuantizedLinear(parts, bias.clone()).to(device)
    assert layer.columns == [(0, 48), (48, 64), (64, 80)]
    assert layer.weight_bytes == sum(p.nbytes for p in parts)
    x = torch.randn(2, rows, 256)
    got = layer(x.to(device)).cpu()
    assert got.shape == (2, rows, 80)
    exact = F.linear(x.double(), stacked.double(), bias.double())
    # the int8 (Q6_K) part takes the integer kernel up to 24 rows; above their limit the
    # parts in blocks of 32 take the integer GEMM where this level has one: both round
    rounded = backend == "cpu" and (
        2 * rows <= cpu_quantized_matmul.INTEGER_DOT_MAX_ROWS[8]
        or any(cpu_quantized_matmul.int16_gemm_serves(part) for part in parts))
    assert relative_error(got, exact) < (3e-4 if rounded else 1e-5)
    for part, (start, stop) in zip(layer.parts, layer.columns, strict=True):
        assert torch.equal(dequantize_weight(part.quantized.to(torch.device("cpu"))),
                           stacked[start:stop])


def test_fused_quantized_linear_refuses_parts_that_do_not_fit() -> None:
    parts, _ = _weights(np.random.default_rng(0))
    with pytest.raises(ValueError, match="two parts"):
        FusedQuantizedLinear(parts[:1])
    other, _ = _weights(np.random.default_rng(1), k=512)
    with pytest.raises(ValueError, match="in_features"):
        FusedQuantizedLinear([parts[0], other[1]])
    with pytest.raises(ValueError, match="bias"):
        FusedQuantizedLinear(parts, torch.zeros(3))


@pytest.mark.usefixtures("weight_only_products")
def test_lora_over_mixed_fused_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter on q/k/v and gate/up adds its update to the columns of each shard of a
    ``FusedQuantizedLinear`` as of one matrix: the tokens of the dequantised model with
    the same adapter, other than those without it."""
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path / "cache"))
    path = write_typed_gguf(tmp_path, _tensor_type)
    adapter = make_peft_adapter(tmp_path / "model", tmp_path / "adapter", seed=5, rank=8,
                                targets=("q_proj", "v_proj", "gate_proj", "up_proj"),
                                alpha=32)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    def tokens(quantization: str, lora: str | None) -> list[list[int]]:
        engine = LLMEngine(EngineConfig(model=str(path), device="cpu", dtype="float32",
                                        quantization=quantization, max_loras=1,
                                        num_kv_blocks=32))
        engine.add_lora("a", adapter)
        if quantization == "gguf":
            wrapped = engine.model.layers[0].self_attn.qkv_proj
            assert isinstance(wrapped, LoraLinear)
            assert isinstance(wrapped.base, FusedQuantizedLinear)
        for i, prompt in enumerate((PROMPT[:7], PROMPT[3:20])):
            engine.add_request(f"r{i}", prompt, params, lora=lora)
        finals = final_outputs(run_engine(engine))
        assert_engine_idle(engine)
        return [finals[f"r{i}"].choices[0].token_ids for i in range(2)]

    with_adapter = tokens("gguf", "a")
    assert with_adapter == tokens("none", "a")
    assert with_adapter != tokens("gguf", None)


def test_a_float_shard_beside_quantized_ones_is_requantized_and_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The one case left requantized: an F32 ``attn_v`` beside Q4_K q/k (the layer becomes
    one int4 matrix from float); the load log names the shards so."""
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path / "cache"))

    def tensor_type(name: str) -> gguf.GGMLQuantizationType:
        return Q.F32 if name.endswith("attn_v.weight") else Q.Q4_K

    path = write_typed_gguf(tmp_path, tensor_type)
    with caplog.at_level(logging.INFO, logger="kvrelay_worker.engine.engine_model"):
        kept = _llm(path, "gguf")
    line = next(r.getMessage() for r in caplog.records if "kept from GGUF" in r.getMessage())
    assert "4 Q4_K requantized (fused with another type)" in line
    assert "fused layers of mixed types" not in line
    qkv = kept.engine.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, QuantizedLinear)
    assert _layouts(qkv) == [(4, 32, True)]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    assert len(kept.generate([PROMPT[:7]], params)[0].choices[0].token_ids) == 4
