"""AutoAWQ-format checkpoints (``quant_method: "awq"``, GEMM packing) served kept quantized.

The checkpoints are made by GPTQModel's AWQ, on CPU, from SmolLM2's float32 folder and
(two variants) the tiny random Llama's (``helpers/make_gptqmodel_checkpoint.py``, cached by
``helpers.compressed_checkpoints``); the
oracle is GPTQModel's own AWQ dequantization (``dequantize_gemm``) of every layer, run by
transformers as a float32 model (``NAME-dequantized``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.compressed_checkpoints import (
    SMOLLM2,
    TINY_SOURCE,
    checkpoints_from_sources,
    layer_count,
)
from helpers.compressed_oracle import PROMPTS
from helpers.engine_run import one_torch_thread
from helpers.hf_reference import hf_greedy
from safetensors import safe_open
from torch import nn

from kvrelay_kernels import cpu_quantized_matmul
from kvrelay_kernels.reference.quantized_matmul import dequantize_weight
from kvrelay_worker.engine.llm import LLM
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.loading import prequantized_model
from kvrelay_worker.loading.hf_folder import read_hf_config
from kvrelay_worker.loading.int_repack import repack_awq_layer
from kvrelay_worker.loading.prequantized_config import (
    AWQ_GEMM,
    PREQUANTIZED_KEY,
    WeightScheme,
    checkpoint_scheme,
)
from kvrelay_worker.loading.prequantized_model import _split
from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.models.quantized_linear import QuantizedLinear
from kvrelay_worker.teacher_forcing import sequence_logits

NEW_TOKENS = 8
PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def _awq(**overrides: Any) -> dict[str, Any]:
    """AutoAWQ's ``quantization_config`` as the hub's AWQ repositories carry it."""
    return {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 128,
            "zero_point": True, "modules_to_not_convert": None, **overrides}


@pytest.mark.parametrize(("quantization", "expected"), [
    (_awq(), WeightScheme(4, False, 128, AWQ_GEMM)),
    (_awq(version="GEMM"), WeightScheme(4, False, 128, AWQ_GEMM)),  # AutoAWQ's spelling
    (_awq(zero_point=False, group_size=64), WeightScheme(4, True, 64, AWQ_GEMM)),
    (_awq(group_size=-1), WeightScheme(4, False, None, AWQ_GEMM)),
    (_awq(modules_to_not_convert=["gate"]), WeightScheme(4, False, 128, AWQ_GEMM)),
    # GPTQModel writes format beside version; AutoAWQ's quant_config.json names w_bit
    ({"quant_method": "awq", "format": "gemm", "bits": 4, "group_size": 32,
      "zero_point": True}, WeightScheme(4, False, 32, AWQ_GEMM)),
    ({"quant_method": "awq", "version": "GEMM", "w_bit": 4, "q_group_size": 128,
      "zero_point": True}, WeightScheme(4, False, 128, AWQ_GEMM)),
])
def test_awq_gemm_configs_are_kept(quantization: dict[str, Any],
                                   expected: WeightScheme) -> None:
    assert checkpoint_scheme(quantization, "config.json") == expected


@pytest.mark.parametrize(("quantization", "match"), [
    (_awq(version="gemv"), "version 'gemv'"),
    (_awq(version="gemv_fast"), "version 'gemv_fast'"),
    (_awq(version="marlin"), "version 'marlin'"),
    (_awq(version="exllama"), "version 'exllama'"),
    (_awq(backend="llm-awq"), "version 'llm-awq'"),
    (_awq(bits=8), "8-bit AWQ"),
    (_awq(bits=3), "3-bit AWQ"),
])
def test_other_awq_packings_are_refused_naming_what_is_supported(
        quantization: dict[str, Any], match: str) -> None:
    with pytest.raises(UnsupportedModelError, match=match) as info:
        checkpoint_scheme(quantization, "config.json")
    assert "AWQ (AutoAWQ, GPTQModel) 4-bit in the GEMM packing" in str(info.value)


# GPTQModel's AWQ (GEMM packing, 4 bits): with zero points in groups of 64 (SmolLM2's 576
# inputs take no group of 128), without (zero_point: false, zero points of 8), and with
# zero points per output channel (group_size -1). The first of SmolLM2, the other two of
# the tiny random Llama (helpers.compressed_checkpoints says why).
AWQ = {"awq-gemm-g64": WeightScheme(4, False, 64, AWQ_GEMM),
       "awq-gemm-g64-sym": WeightScheme(4, True, 64, AWQ_GEMM),
       "awq-gemm-g-1": WeightScheme(4, False, None, AWQ_GEMM)}
AWQ_SOURCES = {"awq-gemm-g64": SMOLLM2, "awq-gemm-g64-sym": TINY_SOURCE,
               "awq-gemm-g-1": TINY_SOURCE}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def awq(smollm2_folder: Path, tiny_model: Callable[[str], Path]) -> Callable[[str], Path]:
    return checkpoints_from_sources(AWQ_SOURCES, smollm2_folder, tiny_model)


@pytest.mark.slow
@pytest.mark.parametrize("name", AWQ)
def test_repacked_awq_layers_dequantize_as_gptqmodel_does(
        name: str, awq: Callable[[str], Path]) -> None:
    folder, dequantized = awq(name), awq(f"{name}-dequantized")
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert (config["quant_method"], config["version"], config["zero_point"]) == (
        "awq", "gemm", not name.endswith("-sym"))
    scheme = read_hf_config(folder).extra[PREQUANTIZED_KEY]
    assert scheme == AWQ[name]
    layer = min(5, layer_count(folder) - 1)
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        tensors = [(k, handle.get_tensor(k)) for k in handle.keys()  # noqa: SIM118
                   if f".layers.{layer}." in k]
    layers, _ = _split(tensors)
    assert len(layers) == 7
    with safe_open(str(dequantized / "model.safetensors"), "pt") as handle:
        for module, parts in layers.items():
            packed = repack_awq_layer(parts, scheme, module)
            packed.check()
            assert packed.bits == 4
            # groups of 64 on SmolLM2's 576 inputs: 32 (the CPU tiles take K / 2 in whole
            # groups)
            stored = scheme.group_size or packed.in_features
            assert packed.group_size == math.gcd(stored, packed.in_features // 2)
            # q * scale + min with min = -zero * scale: both products exact in float32
            torch.testing.assert_close(dequantize_weight(packed),
                                       handle.get_tensor(f"{module}.weight"), rtol=0, atol=0)


def _assert_logits_match(llm: LLM, reference: nn.Module, prompts: list[list[int]], label: str,
                         monkeypatch: pytest.MonkeyPatch) -> float:
    """Every position's logits within 1e-3 (relative to the largest) of the reference
    model's, on the weight-only kernels (the integer kernels also round activations)."""
    worst = 0.0
    monkeypatch.setattr(cpu_quantized_matmul, "INTEGER_DOT_MAX_ROWS", {8: 0, 4: 0})
    monkeypatch.setenv("KVRELAY_CPU_INT16_GEMM", "0")
    with torch.no_grad():
        for prompt in prompts:
            got = sequence_logits(llm.engine, prompt)
            expected = reference(torch.tensor([prompt])).logits[0].float()
            error = float((got - expected).abs().max() / expected.abs().max())
            assert error < 1e-3, (label, prompt, error)
            worst = max(worst, error)
    monkeypatch.undo()
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("name", AWQ)
def test_awq_kept_quantized_matches_gptqmodels_dequantization(
        name: str, awq: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    folder, dequantized = awq(name), awq(f"{name}-dequantized")
    llm = LLM(str(folder), device="cpu", dtype="float32", num_kv_blocks=16, max_num_seqs=8,
              enable_prefix_caching=False)
    model = llm.engine.model
    for i in range(layer_count(folder)):
        for path in PROJECTIONS:
            assert isinstance(model.get_submodule(f"layers.{i}.{path}"), QuantizedLinear), path
    # no float copy of a quantized layer's weight exists
    assert not any(n.endswith("_proj.weight") for n, _ in model.named_parameters())
    reference = AutoModelForCausalLM.from_pretrained(dequantized, dtype=torch.float32).eval()
    prompts = [llm.engine.tokenizer.encode(text) for text in PROMPTS]
    worst = _assert_logits_match(llm, reference, prompts, name, monkeypatch)
    print(f"{name}: worst logits error {worst:.2e} of the largest logit")
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    ours = [list(o.choices[0].token_ids) for o in llm.generate(prompts, params)]
    theirs = hf_greedy(reference, prompts, NEW_TOKENS)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    print(f"{name}: {same} of {len(prompts)} greedy continuations identical")
    assert same >= 7, (name, ours, theirs)


@pytest.mark.slow
def test_awq_layers_are_repacked_as_they_stream_in(awq: Callable[[str], Path]) -> None:
    """At no time does the loader hold more than one decoder layer's stored tensors."""
    most = 0
    flush = prequantized_model._Repacker.flush

    def watched(self: prequantized_model._Repacker) -> None:
        nonlocal most
        most = max(most, len(self.pending))
        flush(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prequantized_model._Repacker, "flush", watched)
        model = prequantized_model.build_prequantized_model(
            awq("awq-gemm-g64"), torch.float32, torch.device("cpu"), 64)
    assert most == 7
    assert isinstance(model.decoder_layers()[0].mlp.down_proj, QuantizedLinear)
