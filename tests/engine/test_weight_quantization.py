"""Weight-only int8/int4 quantized at load: the engine computes with the quantized weights.

How far quantization moves SmolLM2's predictions is measured by ``benchmarks/quality.py``;
random tiny models amplify weight error too much for that to be a useful test here.

Tiny random models: the untied MHA Llama (embeddings quantized on their own) and the tied
Qwen2 with q/k/v biases (embeddings read from the quantized LM head, biases kept float).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from helpers.engine_run import one_torch_thread

from kvrelay_kernels import cpu_quantized_matmul
from kvrelay_kernels.reference.quantized_matmul import dequantize_weight
from kvrelay_worker.engine import EngineConfigError
from kvrelay_worker.engine.llm import LLM
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.models.quantize_model import weight_bytes
from kvrelay_worker.models.quantized_linear import QuantizedEmbedding, QuantizedLinear
from kvrelay_worker.teacher_forcing import sequence_logits

PROMPT = [(37 * i + 11) % 900 + 50 for i in range(40)]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def make_llm(folder: Path, **options: object) -> LLM:
    return LLM(str(folder), device="cpu", dtype="float32", num_kv_blocks=8, max_num_seqs=2,
               enable_prefix_caching=False, **options)


def fake_quantized(float_llm: LLM, quantized_llm: LLM) -> None:
    """Give the float model the dequantized values of the quantized model's weights, written
    into its tensors (the native CPU decode step holds those tensors, not the modules)."""
    float_modules = dict(float_llm.engine.model.named_modules())
    with torch.no_grad():
        for name, module in quantized_llm.engine.model.named_modules():
            if isinstance(module, QuantizedLinear) and not name.endswith(".table"):
                float_modules[name].weight.copy_(dequantize_weight(module.quantized))
            if isinstance(module, QuantizedEmbedding):
                float_modules[name].weight.copy_(dequantize_weight(module.table.quantized))


@pytest.fixture
def weight_only_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """The integer dot-product and GEMM kernels also round activations (their own tests
    bound that); off here, so that logits can be compared to float rounding."""
    monkeypatch.setattr(cpu_quantized_matmul, "INTEGER_DOT_MAX_ROWS", {8: 0, 4: 0})
    monkeypatch.setenv("KVRELAY_CPU_INT16_GEMM", "0")


@pytest.mark.usefixtures("weight_only_products")
@pytest.mark.parametrize("name", ["llama-mha-untied", "qwen2-gqa-bias-tied"])
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_model_computes_with_its_dequantized_weights(
        tiny_model: Callable[[str], Path], name: str, method: str) -> None:
    """Every quantized layer (LM head and embeddings included) is wired where its float
    counterpart was: the engine's logits equal a float engine's on dequantized weights."""
    folder = tiny_model(name)
    llm = make_llm(folder, quantization=method)
    model = llm.engine.model
    assert isinstance(model.lm_head, QuantizedLinear)
    assert isinstance(model.embed_tokens, QuantizedEmbedding)
    assert isinstance(model.layers[0].mlp.gate_up_proj, QuantizedLinear)
    assert isinstance(model.layers[0].self_attn.qkv_proj, QuantizedLinear)
    float_llm = make_llm(folder)
    plain = sequence_logits(float_llm.engine, PROMPT)
    fake_quantized(float_llm, llm)
    expected = sequence_logits(float_llm.engine, PROMPT)
    got = sequence_logits(llm.engine, PROMPT)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got, plain, atol=1e-4)  # the weights really were quantized
    # decode: one row per step through the compiled loop, the same greedy tokens
    params = SamplingParams(max_tokens=4, temperature=0.0)
    ours = llm.generate([PROMPT[:9]], params)[0].choices[0].token_ids
    assert ours == float_llm.generate([PROMPT[:9]], params)[0].choices[0].token_ids


def test_quantized_weights_are_smaller(tiny_model: Callable[[str], Path]) -> None:
    folder = tiny_model("qwen2-gqa-bias-tied")
    sizes = {m: weight_bytes(make_llm(folder, quantization=m).engine.model)
             for m in ("none", "int8", "int4")}
    assert sizes["int8"] < 0.3 * sizes["none"]
    assert sizes["int4"] < 0.2 * sizes["none"]


def test_bad_quantization_settings_are_refused(tiny_model: Callable[[str], Path]) -> None:
    folder = tiny_model("llama-mha-untied")
    with pytest.raises(EngineConfigError, match="quantization must be one of"):
        make_llm(folder, quantization="int3")
    with pytest.raises(EngineConfigError, match="quantization_group_size"):
        make_llm(folder, quantization="int4", quantization_group_size=48)
    with pytest.raises(EngineConfigError, match="gguf"):
        make_llm(folder, quantization="gguf")  # a Hugging Face folder has no GGUF blocks
    assert torch.get_num_threads() == 1
