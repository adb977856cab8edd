"""Loading holds the weights it keeps plus one part in flight: no mapped file, no float
model behind a quantized one, no whole-model copy (figures: ``benchmarks/load_memory.py``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest
import torch
from helpers.tiny_gguf import TINY_VOCAB_SIZE, write_gguf_from_hf
from helpers.tiny_models import build_tiny_model
from safetensors.torch import save_file
from torch import nn

from kvrelay_kernels.quantized_weight import quantize_int4, quantize_int8
from kvrelay_worker.loading import load_progress
from kvrelay_worker.loading.gguf_file import GGUFCheckpoint
from kvrelay_worker.loading.gguf_quantized_model import build_gguf_quantized_model
from kvrelay_worker.loading.hf_folder import iter_safetensors_weights, load_order, read_hf_config
from kvrelay_worker.loading.load_progress import LoadProgress
from kvrelay_worker.loading.safetensors_reader import SafetensorsFile
from kvrelay_worker.models.decoder import CausalLM
from kvrelay_worker.models.factory import build_model
from kvrelay_worker.models.quantize_model import quantize_matrix, quantize_model
from kvrelay_worker.models.quantized_linear import QuantizedEmbedding, QuantizedLinear

CPU = torch.device("cpu")


def _mapped(path: Path) -> bool:
    """Whether this process has ``path`` memory-mapped now."""
    target = str(path.resolve())
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith(target) for line in maps)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama-mha-untied", tmp_path_factory.mktemp("tiny") / "m",
                            vocab_size=TINY_VOCAB_SIZE)


@pytest.fixture(scope="module")
def tiny_tied_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("qwen2-gqa-bias-tied", tmp_path_factory.mktemp("tied") / "m",
                            vocab_size=TINY_VOCAB_SIZE)


def test_the_reader_gives_what_safetensors_wrote(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "f32": torch.randn(3, 5, generator=generator),
        "bf16": torch.randn(7, generator=generator).bfloat16(),
        "f16": torch.randn(2, 2, 2, generator=generator).half(),
        "fp8": torch.randn(4, 4, generator=generator).to(torch.float8_e4m3fn),
        "i32": torch.arange(-6, 6, dtype=torch.int32).reshape(3, 4),
        "u8": torch.arange(10, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
    }
    save_file(tensors, tmp_path / "t.safetensors", metadata={"format": "pt"})
    stored = SafetensorsFile(tmp_path / "t.safetensors")
    assert sorted(stored.names()) == sorted(tensors)
    for name, expected in tensors.items():
        got = stored.read(name)
        assert got.dtype == expected.dtype
        assert got.shape == expected.shape
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))


def test_a_broken_file_is_refused_with_the_reason(tmp_path: Path) -> None:
    save_file({"w": torch.ones(64, 64)}, tmp_path / "ok.safetensors")
    whole = (tmp_path / "ok.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(whole[:-100])
    with pytest.raises(ValueError, match="do not fit"):
        SafetensorsFile(tmp_path / "cut.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match="header length"):
        SafetensorsFile(tmp_path / "junk.safetensors")


def test_weights_stream_without_mapping_the_file(tiny_folder: Path) -> None:
    file = tiny_folder / "model.safetensors"
    seen = 0
    for _name, tensor in iter_safetensors_weights(tiny_folder):
        assert tensor.is_contiguous()
        assert not _mapped(file)
        seen += 1
    assert seen > 10


def test_embeddings_come_first_then_layer_by_layer(tiny_folder: Path) -> None:
    names = [name for name, _ in iter_safetensors_weights(tiny_folder)]
    assert names[:2] == ["model.embed_tokens.weight", "lm_head.weight"]
    keys = [load_order(name) for name in names]
    assert keys == sorted(keys)
    assert load_order("model.layers.10.mlp.up_proj.weight") > load_order(
        "model.layers.2.mlp.up_proj.weight")


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_at_load_holds_one_layer_in_float(tiny_folder: Path, method: str) -> None:
    """At every tensor read, at most one decoder layer still has float projections placed:
    each layer is quantized as soon as it is whole, the embedding table first."""
    config = read_hf_config(tiny_folder)
    holder: list[CausalLM] = []
    worst = 0

    def watched() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal worst
        for item in iter_safetensors_weights(tiny_folder, config):
            if holder:
                float_layers = {
                    name.split(".")[1] for name, module in holder[0].named_modules()
                    if name.startswith("layers.") and type(module) is not QuantizedLinear
                    and isinstance(module, nn.Linear) and not module.weight.is_meta}
                worst = max(worst, len(float_layers))
                if item[0].startswith("model.layers."):
                    assert isinstance(holder[0].embed_tokens, QuantizedEmbedding)
            yield item

    original = CausalLM.load_weights

    def spy(model: CausalLM, *args: object, **kwargs: object) -> None:
        holder.append(model)
        original(model, *args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CausalLM, "load_weights", spy)
        build_model(config, watched(), torch.float32, CPU, 64, quantization=method,
                    weights_owned=True)
    assert holder
    assert worst == 1


@pytest.mark.parametrize("folder_name", ["tiny_folder", "tiny_tied_folder"])
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_at_load_equals_quantizing_the_float_model(
        folder_name: str, method: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(folder_name)
    config = read_hf_config(folder)
    streamed = build_model(config, iter_safetensors_weights(folder, config), torch.float32,
                           CPU, 64, quantization=method, weights_owned=True)
    whole = quantize_model(build_model(config, iter_safetensors_weights(folder, config),
                                       torch.float32, CPU, 64), method)
    a, b = streamed.state_dict(), whole.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    if config.tie_word_embeddings:
        assert isinstance(streamed.embed_tokens, QuantizedEmbedding)
        assert streamed.embed_tokens.table is streamed.lm_head


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_passes_of_rows_quantize_as_the_whole_matrix(method: str) -> None:
    weight = torch.randn(5000, 64, generator=torch.Generator().manual_seed(1))
    weight[4100] = 0.0  # an all-zero row keeps its unit scale in every pass
    got = quantize_matrix(weight, method, 32)
    expected = quantize_int8(weight) if method == "int8" else quantize_int4(weight, 32)
    assert torch.equal(got.qweight, expected.qweight)
    assert torch.equal(got.scales, expected.scales)
    assert (got.mins is None) == (expected.mins is None)
    if got.mins is not None and expected.mins is not None:
        assert torch.equal(got.mins, expected.mins)


def test_fresh_reads_become_parameters_and_caller_tensors_are_copied(
        tiny_folder: Path) -> None:
    config = read_hf_config(tiny_folder)
    given = dict(iter_safetensors_weights(tiny_folder, config))
    owned = build_model(config, iter(given.items()), torch.float32, CPU, 64,
                        weights_owned=True)
    assert owned.embed_tokens.weight.data_ptr() == given["model.embed_tokens.weight"].data_ptr()
    copied = build_model(config, iter(given.items()), torch.float32, CPU, 64)
    assert copied.embed_tokens.weight.data_ptr() != given["model.embed_tokens.weight"].data_ptr()
    assert torch.equal(copied.embed_tokens.weight, given["model.embed_tokens.weight"])
    # a tensor in another dtype is converted into fresh storage, never adopted
    halved = build_model(config, iter(given.items()), torch.bfloat16, CPU, 64,
                         weights_owned=True)
    assert halved.embed_tokens.weight.dtype == torch.bfloat16


def test_kept_gguf_load_leaves_no_mapping(tiny_folder: Path, tmp_path: Path) -> None:
    path = write_gguf_from_hf(tiny_folder, tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q8_0)
    checkpoint = GGUFCheckpoint(path)
    model, formats = build_gguf_quantized_model(checkpoint, torch.float32, CPU, 64)
    assert formats
    assert all(f.how == "repacked" for f in formats.values())
    assert not _mapped(path)  # the checkpoint is still open: nothing of it stays resident
    assert isinstance(model.decoder_layers()[0].self_attn.qkv_proj, QuantizedLinear)


def test_a_slow_load_logs_how_far_it_has_got(caplog: pytest.LogCaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load_progress, "QUIET_SECONDS", 0.0)
    monkeypatch.setattr(load_progress, "LOG_EVERY_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger=load_progress.__name__):
        with LoadProgress(4 << 20, "model-x") as bar:
            bar.advance(1 << 20)
            bar.advance(3 << 20)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("loading model-x: 1.0 of 4.0 MiB (25%)")
    assert lines[-1].startswith("loaded model-x: 4.0 of 4.0 MiB (100%)")


def test_a_quick_load_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=load_progress.__name__):
        with LoadProgress(1 << 20, "model-y") as bar:
            bar.advance(1 << 20)
    assert not caplog.records
