"""Published quantized checkpoints served kept quantized: compressed-tensors
(llmcompressor's W4A16/W8A16, AWQ) and GPTQ (GPTQModel, 4 and 8 bits, activation order).

The checkpoints are made by llmcompressor itself, data-free, from SmolLM2's float32
folder (``helpers.compressed_checkpoints``); the oracle is compressed-tensors' own
decompression: per layer its compressor's ``decompress``, and for the model transformers
loading the folder with ``run_compressed=False`` (which calls ``decompress_model``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.compressed_checkpoints import (
    SMOLLM2,
    TINY_SOURCE,
    cached_checkpoints,
    checkpoints_from_sources,
    layer_count,
)
from helpers.compressed_oracle import PROMPTS, decompressed_model, oracle_scheme
from helpers.engine_run import one_torch_thread
from helpers.hf_reference import hf_greedy
from safetensors import safe_open
from torch import nn

from kvrelay_kernels import cpu_quantized_matmul
from kvrelay_kernels.reference.quantized_matmul import dequantize_weight
from kvrelay_worker.engine.errors import EngineConfigError
from kvrelay_worker.engine.llm import LLM
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.loading import prequantized_model
from kvrelay_worker.loading.hf_folder import read_hf_config
from kvrelay_worker.loading.int_repack import repack_gptq_layer, repack_layer
from kvrelay_worker.loading.prequantized_config import PREQUANTIZED_KEY
from kvrelay_worker.loading.prequantized_model import _split
from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.models.permuted_linear import InputPermutedLinear
from kvrelay_worker.models.quantize_model import weight_bytes
from kvrelay_worker.models.quantized_linear import QuantizedLinear
from kvrelay_worker.teacher_forcing import sequence_logits

compressed_tensors = pytest.importorskip("compressed_tensors")

NEW_TOKENS = 8
# llmcompressor's schemes (make_compressed_checkpoint.py): W4A16 is its preset (group 128,
# so only the 1536-input down_proj layers; the 576-input ones stay float); AWQ smooths
# (norm weights included) on a few local sentences, then quantizes asymmetric int4.
SCHEMES = ["W4A16", "W4A16-g64", "W4A16-asym-g64", "W8A16-channel", "W8A16-asym-channel",
           "AWQ-W4A16-asym-g64"]
# FP8 is kept (test_fp8_checkpoints.py); 4-bit floats are not.
REFUSED = {"NVFP4A16": "4-bit float weights", "MXFP4A16": "4-bit float weights"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def compressed(smollm2_folder: Path) -> Callable[[str], Path]:
    root = cached_checkpoints(smollm2_folder, [*SCHEMES, *REFUSED])
    return lambda scheme: root / scheme


def _assert_logits_match(llm: LLM, reference: nn.Module, prompts: list[list[int]], label: str,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every position's logits within 1e-3 (relative to the largest) of the reference
    model's, on the weight-only kernels (the integer kernels also round activations); the
    kernels a worker serves with are back afterwards, for the greedy runs that follow."""
    monkeypatch.setattr(cpu_quantized_matmul, "INTEGER_DOT_MAX_ROWS", {8: 0, 4: 0})
    monkeypatch.setenv("KVRELAY_CPU_INT16_GEMM", "0")
    with torch.no_grad():
        for prompt in prompts:
            got = sequence_logits(llm.engine, prompt)
            expected = reference(torch.tensor([prompt])).logits[0].float()
            error = (got - expected).abs().max() / expected.abs().max()
            assert error < 1e-3, (label, prompt, float(error))
    monkeypatch.undo()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_repacked_layers_dequantize_as_compressed_tensors_does(
        scheme: str, compressed: Callable[[str], Path]) -> None:
    folder = compressed(scheme)
    ours = read_hf_config(folder).extra[PREQUANTIZED_KEY]
    compressor, oracle = oracle_scheme(folder)
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        tensors = [(k, handle.get_tensor(k)) for k in handle.keys()  # noqa: SIM118
                   if ".layers.3." in k]
    layers, _ = _split(tensors)
    assert layers
    for module, parts in layers.items():
        packed = repack_layer(parts, ours, module)
        expected = compressor.decompress(dict(parts), oracle)["weight"]  # type: ignore[attr-defined]
        got = dequantize_weight(packed)
        # int8: the same products; int4: q * scale + min, one rounding from (q - zp) * scale
        torch.testing.assert_close(got, expected.float(), rtol=0, atol=1e-6)
        if ours.bits == 4:
            assert (packed.in_features // 2) % packed.group_size == 0  # the CPU tiles serve it


@pytest.fixture
def weight_only_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """The integer dot-product and GEMM kernels also round activations: off for the logits
    check."""
    monkeypatch.setattr(cpu_quantized_matmul, "INTEGER_DOT_MAX_ROWS", {8: 0, 4: 0})
    monkeypatch.setenv("KVRELAY_CPU_INT16_GEMM", "0")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_smollm2_kept_quantized_matches_the_decompressed_model(
        scheme: str, compressed: Callable[[str], Path], smollm2_folder: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = compressed(scheme)
    llm = LLM(str(folder), device="cpu", dtype="float32", num_kv_blocks=16, max_num_seqs=8,
              enable_prefix_caching=False, quantization="auto")
    model = llm.engine.model
    float_names = {name for name, _ in model.named_parameters()}
    quantized = {name for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    # down_proj always quantized; the others too unless the preset left them float
    assert all(f"layers.{i}.mlp.down_proj" in quantized for i in range(30))
    all_quantized = scheme != "W4A16"
    for i in range(30):
        for path in (f"layers.{i}.self_attn.qkv_proj", f"layers.{i}.self_attn.o_proj",
                     f"layers.{i}.mlp.gate_up_proj", f"layers.{i}.mlp.down_proj"):
            assert (path in quantized) == (all_quantized or path.endswith("down_proj"))
            # no float copy of a quantized layer's weight exists
            assert (f"{path}.weight" in float_names) == (path not in quantized)
    assert weight_bytes(model) < _float_bytes(smollm2_folder)

    tokenizer = llm.engine.tokenizer
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    reference = decompressed_model(folder)
    _assert_logits_match(llm, reference, prompts, scheme, monkeypatch)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    ours = [o.choices[0].token_ids for o in llm.generate(prompts, params)]
    with torch.no_grad():
        theirs = []
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = reference.generate(ids, attention_mask=torch.ones_like(ids),  # type: ignore[operator]
                                     max_new_tokens=NEW_TOKENS, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)
            theirs.append(out[0, len(prompt):].tolist())
    same = sum(list(a) == b for a, b in zip(ours, theirs, strict=True))
    assert same >= 7, (scheme, ours, theirs)


def _float_bytes(folder: Path) -> int:
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        return sum(4 * math.prod(handle.get_slice(k).get_shape())
                   for k in handle.keys())  # noqa: SIM118 - safe_open is not a Mapping


def test_float_quantization_options_are_refused_on_a_quantized_checkpoint(
        compressed: Callable[[str], Path]) -> None:
    with pytest.raises(EngineConfigError, match="already quantized"):
        LLM(str(compressed("W8A16-channel")), device="cpu", dtype="float32", num_kv_blocks=4,
            quantization="int4")


@pytest.mark.parametrize(("scheme", "match"), REFUSED.items())
def test_schemes_without_a_layout_are_refused_naming_what_is(
        scheme: str, match: str, compressed: Callable[[str], Path]) -> None:
    with pytest.raises(UnsupportedModelError, match=match) as info:
        read_hf_config(compressed(scheme))
    assert "supported pre-quantized checkpoints: compressed-tensors" in str(info.value)


@pytest.mark.integration
def test_a_worker_serves_a_compressed_checkpoint_kept_quantized(
        compressed: Callable[[str], Path], redis_server_factory: Callable[[], Any],
        tmp_path: Path) -> None:
    """Through the queue, a real worker: the same greedy tokens as the offline engine."""
    from helpers.worker_process import WorkerProcess

    from kvrelay import Client

    folder = compressed("W4A16-g64")
    offline = LLM(str(folder), device="cpu", dtype="float32", num_kv_blocks=16,
                  max_num_seqs=2, enable_prefix_caching=False)
    prompt = offline.engine.tokenizer.encode(PROMPTS[0])
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    expected = list(offline.generate([prompt], params)[0].choices[0].token_ids)
    server = redis_server_factory()
    worker = WorkerProcess("ct-w4a16", server.url, str(folder), tmp_path, concurrency=2,
                           model_name="ct-w4a16", dtype="float32").start()
    try:
        worker.wait_ready(timeout=180)
        with Client(server.url, model="ct-w4a16", stream_timeout=120) as client:
            result = client.generate(prompt_token_ids=prompt, max_tokens=NEW_TOKENS,
                                     temperature=0.0, ignore_eos=True)
        assert list(result.token_ids) == expected
        assert "kept as stored (int4 symmetric, groups of 64" in worker.tail(None)
    finally:
        worker.stop()


# GPTQModel's checkpoints (make_gptqmodel_checkpoint.py): activation order scatters each group's
# inputs (a g_idx per layer); SmolLM2's 576 inputs end in a partial group of 64. The 8-bit
# one is of the tiny random Llama (helpers.compressed_checkpoints says why).
GPTQ = {"gptq-4bit-g128-desc": SMOLLM2, "gptq-8bit-g128-desc": TINY_SOURCE}


@pytest.fixture(scope="session")
def gptq(smollm2_folder: Path, tiny_model: Callable[[str], Path]) -> Callable[[str], Path]:
    return checkpoints_from_sources(GPTQ, smollm2_folder, tiny_model)


@pytest.mark.parametrize("name", GPTQ)
def test_gptq_kept_quantized_matches_gptqmodels_dequantization(
        name: str, gptq: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The oracle is GPTQModel's own ``dequantize_weight`` of every layer, run by
    transformers as a float32 model (``NAME-dequantized``)."""
    from transformers import AutoModelForCausalLM

    folder, dequantized = gptq(name), gptq(f"{name}-dequantized")
    scheme = read_hf_config(folder).extra[PREQUANTIZED_KEY]
    layer_total = layer_count(folder)
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        tensors = [(k, handle.get_tensor(k)) for k in handle.keys()  # noqa: SIM118
                   if f".layers.{min(5, layer_total - 1)}." in k]
    layers, _ = _split(tensors)
    assert len(layers) == 7
    with safe_open(str(dequantized / "model.safetensors"), "pt") as handle:
        for module, parts in layers.items():
            packed, order = repack_gptq_layer(parts, scheme, module)
            assert order is not None  # desc_act: the groups were scattered
            got = torch.empty(packed.out_features, packed.in_features)
            got[:, order] = dequantize_weight(packed)
            torch.testing.assert_close(got, handle.get_tensor(f"{module}.weight"),
                                       rtol=0, atol=1e-6)

    llm = LLM(str(folder), device="cpu", dtype="float32", num_kv_blocks=16, max_num_seqs=8,
              enable_prefix_caching=False)
    model = llm.engine.model
    for i in range(layer_total):
        for path in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                     "mlp.down_proj"):
            module = model.get_submodule(f"layers.{i}.{path}")
            assert isinstance(module, InputPermutedLinear), path
            assert isinstance(module.inner, QuantizedLinear)
    assert not any(name.endswith("_proj.weight") for name, _ in model.named_parameters())
    reference = AutoModelForCausalLM.from_pretrained(dequantized, dtype=torch.float32).eval()
    prompts = [llm.engine.tokenizer.encode(text) for text in PROMPTS]
    _assert_logits_match(llm, reference, prompts, name, monkeypatch)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    ours = [list(o.choices[0].token_ids) for o in llm.generate(prompts, params)]
    theirs = hf_greedy(reference, prompts, NEW_TOKENS)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    assert same >= 7, (name, ours, theirs)


@pytest.mark.parametrize("kind", ["W4A16-g64", "gptq-4bit-g128-desc"])
def test_layers_are_repacked_as_they_stream_in(
        kind: str, compressed: Callable[[str], Path], gptq: Callable[[str], Path]) -> None:
    """The loader repacks each decoder layer when the next one starts arriving: at no
    time does it hold more than one layer's stored tensors (seven projections)."""
    folder = gptq(kind) if kind.startswith("gptq") else compressed(kind)
    most = 0
    flush = prequantized_model._Repacker.flush

    def watched(self: prequantized_model._Repacker) -> None:
        nonlocal most
        most = max(most, len(self.pending))
        flush(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prequantized_model._Repacker, "flush", watched)
        model = prequantized_model.build_prequantized_model(
            folder, torch.float32, torch.device("cpu"), 64)
    assert most == 7
    assert isinstance(model.decoder_layers()[0].mlp.down_proj, (QuantizedLinear,
                                                                  InputPermutedLinear))
