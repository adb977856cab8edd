"""compressed-tensors FP8 checkpoints served with their FP8 weights kept as stored.

Made by llmcompressor from SmolLM2's float32 folder (``helpers.compressed_checkpoints``):
``FP8_DYNAMIC`` (a scale per channel, activations per token at run time), ``FP8`` (a
scale per tensor, a static activation scale calibrated on local sentences),
``FP8_BLOCK`` (128x128 blocks; SmolLM2's 576 and 192 leave partial ones) and
``FP8-channel`` (weight-only). The oracle is compressed-tensors' own decompression, per
layer and, through transformers, for the whole model. On CPU the products are
weight-only (float activations), as transformers' decompressed model computes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from helpers.compressed_checkpoints import cached_checkpoints
from helpers.compressed_oracle import PROMPTS, decompressed_model, oracle_scheme
from helpers.engine_run import one_torch_thread
from helpers.hf_reference import hf_greedy
from safetensors import safe_open

from kvrelay_kernels.fp8_matmul import fp8_matmul
from kvrelay_worker.engine.llm import LLM
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.loading.fp8_repack import repack_fp8_layer
from kvrelay_worker.loading.hf_folder import read_hf_config
from kvrelay_worker.loading.prequantized_config import PREQUANTIZED_KEY, Fp8Scheme
from kvrelay_worker.loading.prequantized_model import _split
from kvrelay_worker.models.fp8_linear import Fp8Linear
from kvrelay_worker.models.quantize_model import weight_bytes
from kvrelay_worker.teacher_forcing import sequence_logits

compressed_tensors = pytest.importorskip("compressed_tensors")

# scheme -> (weight strategy, activations as the engine reads them)
SCHEMES = {"FP8_DYNAMIC": ("channel", "dynamic"), "FP8": ("tensor", "static"),
           "FP8_BLOCK": ("block", "dynamic"), "FP8-channel": ("channel", "none")}
PATHS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
NEW_TOKENS = 8

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def fp8(smollm2_folder: Path) -> Callable[[str], Path]:
    root = cached_checkpoints(smollm2_folder, list(SCHEMES))
    return lambda scheme: root / scheme


@pytest.mark.parametrize("scheme", SCHEMES)
def test_each_layers_product_is_the_decompressed_weights(
        scheme: str, fp8: Callable[[str], Path]) -> None:
    folder = fp8(scheme)
    ours = read_hf_config(folder).extra[PREQUANTIZED_KEY]
    assert isinstance(ours, Fp8Scheme)
    assert (ours.strategy, ours.activations) == SCHEMES[scheme]
    compressor, oracle = oracle_scheme(folder)
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        tensors = [(k, handle.get_tensor(k)) for k in handle.keys()  # noqa: SIM118
                   if ".layers.3." in k]
    layers, _ = _split(tensors)
    assert len(layers) == 7
    torch.manual_seed(0)
    for module, parts in layers.items():
        kept = repack_fp8_layer(parts, ours, module)
        assert kept.weight.data_ptr() == parts["weight"].data_ptr()  # the stored bytes
        weight = compressor.decompress(dict(parts), oracle)["weight"]  # type: ignore[attr-defined]
        x = torch.randn(5, kept.in_features)
        expected = x.double() @ weight.double().T
        error = (fp8_matmul(x, kept).double() - expected).abs().max() / expected.abs().max()
        assert error < 1e-5, (module, float(error))


def test_fused_shards_keep_their_own_tensor_scales(fp8: Callable[[str], Path]) -> None:
    """FP8 scales each of q, k, v (gate, up) by its own tensor scale: fused, every channel
    keeps its shard's."""
    folder = fp8("FP8")
    compressor, oracle = oracle_scheme(folder)
    llm = LLM(str(folder), device="cpu", dtype="float32", num_kv_blocks=4, max_num_seqs=1,
              enable_prefix_caching=False)
    torch.manual_seed(1)
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        for fused, shards in (("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")),
                              ("mlp.gate_up_proj", ("gate_proj", "up_proj"))):
            parent = fused.split(".")[0]
            weights, scales = [], set()
            for shard in shards:
                prefix = f"model.layers.7.{parent}.{shard}."
                parts = {leaf: handle.get_tensor(prefix + leaf)
                         for leaf in ("weight", "weight_scale")}
                scales.add(float(parts["weight_scale"]))
                weights.append(compressor.decompress(parts, oracle)["weight"])  # type: ignore[attr-defined]
            assert len(scales) == len(shards)  # really different scales
            layer = llm.engine.model.get_submodule(f"layers.7.{fused}")
            assert isinstance(layer, Fp8Linear)
            x = torch.randn(3, layer.in_features)
            expected = x.double() @ torch.cat(weights).double().T
            error = (layer(x).double() - expected).abs().max() / expected.abs().max()
            assert error < 1e-5, (fused, float(error))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_smollm2_kept_in_fp8_matches_the_decompressed_model(
        scheme: str, fp8: Callable[[str], Path], smollm2_folder: Path) -> None:
    folder = fp8(scheme)
    llm = LLM(str(folder), device="cpu", dtype="float32", num_kv_blocks=16, max_num_seqs=8,
              enable_prefix_caching=False)
    model = llm.engine.model
    float_names = {name for name, _ in model.named_parameters()}
    for i in range(30):
        for path in PATHS:
            layer = model.get_submodule(f"layers.{i}.{path}")
            assert isinstance(layer, Fp8Linear), path
            # the FP8 bytes, one per weight, and no float copy of the matrix
            assert layer.fp8_bytes.dtype == torch.uint8
            assert layer.fp8_bytes.numel() == layer.in_features * layer.out_features
            assert f"layers.{i}.{path}.weight" not in float_names
    assert weight_bytes(model) < 0.6 * _float_bytes(smollm2_folder)

    reference = decompressed_model(folder)
    prompts = [llm.engine.tokenizer.encode(text) for text in PROMPTS]
    with torch.no_grad():
        for prompt in prompts:
            got = sequence_logits(llm.engine, prompt)
            expected = reference(torch.tensor([prompt])).logits[0].float()
            error = (got - expected).abs().max() / expected.abs().max()
            assert error < 1e-3, (scheme, prompt, float(error))
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    ours = [list(o.choices[0].token_ids) for o in llm.generate(prompts, params)]
    theirs = hf_greedy(reference, prompts, NEW_TOKENS)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    assert same >= 7, (scheme, ours, theirs)


def _float_bytes(folder: Path) -> int:
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        return sum(4 * math.prod(handle.get_slice(k).get_shape())
                   for k in handle.keys())  # noqa: SIM118 - safe_open is not a Mapping
