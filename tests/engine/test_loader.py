"""Loading configs, weights and tokenizers from Hugging Face folders and GGUF files."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from helpers.tiny_gguf import TINY_VOCAB_SIZE, write_gguf_from_hf
from helpers.tiny_models import TINY_MODEL_NAMES, TINY_MODELS, build_tiny_model
from safetensors.torch import load_file

from kvrelay_worker.loading import (
    cache_layout,
    gguf_file,
    load_model_source,
    model_cache,
    resolve_model,
)
from kvrelay_worker.loading.hf_folder import (
    config_from_hf_dict,
    hf_dict_from_config,
    iter_safetensors_weights,
    read_hf_config,
)
from kvrelay_worker.loading.model_cache import prepare_model
from kvrelay_worker.loading.prequantized_config import PREQUANTIZED_KEY
from kvrelay_worker.loading.tokenizer import load_tokenizer
from kvrelay_worker.models.errors import UnknownModelError, UnsupportedModelError
from kvrelay_worker.models.families import family_of

SMOLLM2 = "smollm2-135m-instruct"
TEXTS = [
    "Hello world!",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "Unicode: héllo wörld — 日本語 🙂",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return x ** 2  # code",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Count to 3"},
]


@pytest.fixture
def temp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def llama_dict(**overrides) -> dict:
    base = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 1000,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    }
    return {**base, **overrides}


# --- config.json parsing -------------------------------------------------------------


def test_llama_config_defaults() -> None:
    config = config_from_hf_dict(llama_dict(eos_token_id=[7, 9], bos_token_id=1))
    assert config.head_dim == 64  # hidden / heads when head_dim is absent
    assert config.num_key_value_heads == 4  # MHA when num_key_value_heads is absent
    assert config.eos_token_ids == (7, 9)
    assert config.bos_token_id == 1
    assert config.pad_token_id is None
    assert config.rope_theta == 10000.0
    assert config.rope_scaling is None
    assert not config.tie_word_embeddings
    assert not config.attention_bias
    assert not config.attention_output_bias
    assert config.model_type == "llama"


def test_transformers5_rope_parameters() -> None:
    plain = config_from_hf_dict(
        llama_dict(rope_parameters={"rope_type": "default", "rope_theta": 123456.0})
    )
    assert plain.rope_theta == 123456.0
    assert plain.rope_scaling is None
    scaled = config_from_hf_dict(
        llama_dict(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            }
        )
    )
    assert scaled.rope_theta == 500000.0
    assert scaled.rope_scaling == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


def test_legacy_rope_scaling_type_key() -> None:
    config = config_from_hf_dict(
        llama_dict(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0})
    )
    assert config.rope_theta == 5e5
    assert config.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_eos_from_generation_config_is_merged(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(llama_dict(eos_token_id=5)))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 6]}))
    assert read_hf_config(tmp_path).eos_token_ids == (5, 6)


def test_biases_by_architecture() -> None:
    qwen = config_from_hf_dict(
        llama_dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", attention_bias=False)
    )
    assert qwen.attention_bias
    assert not qwen.attention_output_bias
    assert not qwen.mlp_bias
    llama = config_from_hf_dict(llama_dict(attention_bias=True, mlp_bias=True))
    assert llama.attention_bias
    assert llama.attention_output_bias
    assert llama.mlp_bias


@pytest.mark.parametrize(
    ("arch", "extra", "windowed"),
    [
        ("MistralForCausalLM", {"sliding_window": 4096}, (True, True)),
        ("MistralForCausalLM", {}, (True, True)),  # transformers' default window: 4096
        ("MistralForCausalLM", {"sliding_window": None}, ()),
        ("LlamaForCausalLM", {"sliding_window": 4096}, ()),  # Llama never windows
        (
            "Qwen2ForCausalLM",
            {"sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 0},
            (),
        ),
        (
            "Qwen2ForCausalLM",
            {"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 2},
            (),  # only layers >= max_window_layers slide, and there are 2 layers
        ),
        (
            "Qwen2ForCausalLM",
            {"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 1},
            (False, True),
        ),
        (
            "Qwen2ForCausalLM",
            {
                "sliding_window": 4096,
                "use_sliding_window": True,
                "layer_types": ["full_attention", "sliding_attention"],
            },
            (False, True),
        ),
        ("Phi3ForCausalLM", {"sliding_window": 2047}, (True, True)),
        ("Gemma2ForCausalLM", {}, (True, False)),  # even layers window, odd ones do not
        ("Gemma3ForCausalLM", {"sliding_window_pattern": 2}, (True, False)),
    ],
)
def test_sliding_window(arch: str, extra: dict, windowed: tuple[bool, ...]) -> None:
    config = config_from_hf_dict(llama_dict(architectures=[arch], **extra))
    assert config.sliding_layers == windowed
    assert (config.sliding_window is not None) == bool(windowed)
    # Blocks can be released only when every layer windows.
    assert (config.kv_window is not None) == (bool(windowed) and all(windowed))


def test_gemma_switches() -> None:
    gemma2 = config_from_hf_dict(llama_dict(architectures=["Gemma2ForCausalLM"],
                                            query_pre_attn_scalar=144))
    assert gemma2.sandwich_norms
    assert gemma2.norm_weight_offset == 1.0
    assert gemma2.embedding_multiplier == pytest.approx(16.0)
    assert gemma2.attention_scale == pytest.approx(144**-0.5)
    assert (gemma2.attn_logit_softcapping, gemma2.final_logit_softcapping) == (50.0, 30.0)
    assert gemma2.hidden_act == "gelu_pytorch_tanh"
    assert gemma2.tie_word_embeddings
    gemma3 = config_from_hf_dict(llama_dict(
        architectures=["Gemma3ForCausalLM"], num_hidden_layers=6,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}))
    assert gemma3.qk_norm
    assert gemma3.attn_logit_softcapping is None
    assert gemma3.sliding_layers == (True,) * 5 + (False,)
    assert (gemma3.rope_theta, gemma3.local_rope_theta) == (1e6, 1e4)
    assert gemma3.rope_scaling == {"rope_type": "linear", "factor": 8.0}


def test_mixture_of_experts_switches() -> None:
    mixtral = config_from_hf_dict(llama_dict(architectures=["MixtralForCausalLM"],
                                             num_local_experts=8, num_experts_per_tok=2))
    assert (mixtral.num_experts, mixtral.num_experts_per_tok) == (8, 2)
    assert mixtral.moe_intermediate_size == 512
    assert mixtral.norm_topk_prob
    assert mixtral.moe_layers == (True, True)
    qwen = config_from_hf_dict(llama_dict(
        architectures=["Qwen3MoeForCausalLM"], num_hidden_layers=4, num_experts=16,
        num_experts_per_tok=4, moe_intermediate_size=64, decoder_sparse_step=2,
        mlp_only_layers=[3]))
    assert qwen.qk_norm
    assert not qwen.norm_topk_prob
    assert qwen.moe_layers == (False, True, False, False)
    assert (qwen.num_experts, qwen.moe_intermediate_size) == (16, 64)


def _ct_config(input_activations: dict | None = None, **weights: object) -> dict:
    """A compressed-tensors ``quantization_config`` as llmcompressor writes it (W8A16)."""
    args = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True,
            "group_size": None, "dynamic": False, "actorder": None, **weights}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed", "sparsity_config": {},
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": args,
                                          "input_activations": input_activations,
                                          "format": "pack-quantized"}}}


def test_a_compressed_tensors_w8a16_config_is_kept() -> None:
    config = config_from_hf_dict(llama_dict(quantization_config=_ct_config()))
    scheme = config.extra[PREQUANTIZED_KEY]
    assert (scheme.bits, scheme.symmetric, scheme.group_size) == (8, True, None)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel.*LlamaForCausalLM"),
        ({"architectures": None, "model_type": "gemma"}, "gemma"),
        ({"architectures": ["Gemma3ForConditionalGeneration"]}, "Gemma3ForConditionalGeneration"),
        ({"architectures": ["Gemma2ForCausalLM"], "use_bidirectional_attention": True},
         "bidirectional"),
        ({"hidden_act": "gelu"}, "gelu"),
        ({"quantization_config": {"quant_method": "awq"}}, "awq"),
        ({"quantization_config": _ct_config(type="float")}, "float weights"),
        ({"quantization_config": _ct_config(input_activations={"num_bits": 8})},
         "quantizes activations"),
        ({"quantization_config": _ct_config(strategy="block")}, "'block' strategy"),
        ({"quantization_config": _ct_config(num_bits=2)}, "2-bit"),
        ({"quantization_config": {"quant_method": "gptq", "bits": 4, "sym": False,
                                  "checkpoint_format": "gptq"}}, "asymmetric 4-bit GPTQ"),
        ({"quantization_config": {"quant_method": "gptq", "bits": 3}}, "3-bit GPTQ"),
        ({"quantization_config": {"quant_method": "gptq", "bits": 4,
                                  "checkpoint_format": "marlin"}}, "'marlin'"),
        ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial"),
    ],
)
def test_unsupported_configs(overrides: dict, match: str) -> None:
    with pytest.raises(UnsupportedModelError, match=match):
        config_from_hf_dict(llama_dict(**overrides))


def test_unsupported_architecture_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(llama_dict(architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox"))
    )
    with pytest.raises(UnsupportedModelError, match="GPTNeoXForCausalLM") as info:
        load_model_source(tmp_path)
    assert isinstance(info.value, ValueError)


def test_pickled_weights_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(llama_dict()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    loaded = load_model_source(tmp_path)
    with pytest.raises(UnsupportedModelError, match="safetensors"):
        next(loaded.weights())


def test_unknown_name() -> None:
    with pytest.raises(UnknownModelError, match=SMOLLM2):
        load_model_source("llama-9000")


# --- tiny Hugging Face folders --------------------------------------------------------


@pytest.mark.parametrize("name", TINY_MODEL_NAMES)
def test_tiny_hf_folder_loads(name: str, tiny_model: Callable[[str], Path]) -> None:
    from transformers import AutoConfig

    folder = tiny_model(name)
    loaded = load_model_source(folder)
    assert loaded.name == name
    assert loaded.path == folder.resolve()
    hf = AutoConfig.from_pretrained(folder)
    config = loaded.config
    assert hf.model_type in family_of(config.model_type).hf_model_types
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "tie_word_embeddings",
        "rms_norm_eps",
        "bos_token_id",
        "pad_token_id",
    ):
        assert getattr(config, field) == getattr(hf, field), field
    assert config.head_dim == 64
    assert config.eos_token_ids == (hf.eos_token_id,)
    assert config.attention_bias == (hf.model_type == "qwen2")
    spec = TINY_MODELS[name]
    if "rope_parameters" not in spec:  # Gemma 3's per-layer-type RoPE: test_gemma_switches
        assert config.rope_theta == spec.get("rope_theta", 10000.0)
        assert config.rope_scaling == spec.get("rope_scaling")

    expected = load_file(str(folder / "model.safetensors"))
    weights = dict(loaded.weights())
    assert set(weights) == set(expected)
    assert ("lm_head.weight" in weights) == (not config.tie_word_embeddings)
    assert all(torch.equal(weights[k], expected[k]) for k in expected)
    if config.attention_bias:
        assert "model.layers.0.self_attn.q_proj.bias" in weights
    assert len(loaded.tokenizer) == config.vocab_size
    assert loaded.tokenizer.chat_template


@pytest.mark.parametrize("name", TINY_MODEL_NAMES)
def test_written_config_round_trips_through_transformers(
    name: str, tiny_model: Callable[[str], Path]
) -> None:
    from transformers import AutoConfig

    config = load_model_source(tiny_model(name)).config
    if config.model_type not in ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3",
                                 "mixtral", "qwen3_moe"):
        # Only the families GGUF files convert into are written back; others refuse.
        with pytest.raises(UnsupportedModelError, match=r"cannot write a config\.json"):
            hf_dict_from_config(config)
        return
    raw = hf_dict_from_config(config)
    assert config_from_hf_dict(raw) == config
    hf = AutoConfig.for_model(**raw)
    assert hf.num_key_value_heads == config.num_key_value_heads
    assert hf.tie_word_embeddings == config.tie_word_embeddings


def test_sharded_and_bare_checkpoints(tmp_path: Path) -> None:
    from helpers.tiny_models import build_tiny_hf_model

    model = build_tiny_hf_model("llama-mha-untied", vocab_size=TINY_VOCAB_SIZE)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="300KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    weights = dict(iter_safetensors_weights(tmp_path / "sharded"))
    state = model.state_dict()
    assert set(weights) == set(state)
    assert all(torch.equal(weights[k], state[k]) for k in state)


# --- GGUF files (tiny vocabulary, so conversion takes well under a second) -----------

GGUF_CASES = [
    ("llama-mha-untied", gguf.GGMLQuantizationType.F32),
    ("llama-mqa", gguf.GGMLQuantizationType.Q8_0),
    ("qwen2-gqa-bias-tied", gguf.GGMLQuantizationType.F16),
    ("llama3-rope", gguf.GGMLQuantizationType.F32),
    ("qwen3-qk-norm", gguf.GGMLQuantizationType.Q8_0),
]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path]]:
    """Factory: ``(hf_folder, gguf_path)`` for a tiny model stored as ``qtype``."""
    root = tmp_path_factory.mktemp("tiny-gguf")
    built: dict[tuple[str, gguf.GGMLQuantizationType], tuple[Path, Path]] = {}

    def get(name: str, qtype: gguf.GGMLQuantizationType) -> tuple[Path, Path]:
        if (name, qtype) not in built:
            folder = build_tiny_model(name, root / name, vocab_size=TINY_VOCAB_SIZE)
            path = write_gguf_from_hf(folder, root / f"{name}-{qtype.name}.gguf", qtype)
            built[name, qtype] = (folder, path)
        return built[name, qtype]

    return get


def _stored(weight: torch.Tensor, qtype: gguf.GGMLQuantizationType) -> torch.Tensor:
    """What a weight becomes after a round trip through ``qtype`` (1-D stays float32)."""
    if weight.dim() == 1 or qtype == gguf.GGMLQuantizationType.F32:
        return weight
    array = weight.numpy()
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(array, qtype), qtype))


@pytest.mark.parametrize(("name", "qtype"), GGUF_CASES)
def test_tiny_gguf_matches_hf_model(
    name: str, qtype: gguf.GGMLQuantizationType, tiny_gguf, temp_cache: Path
) -> None:
    folder, path = tiny_gguf(name, qtype)
    loaded = load_model_source(path)
    reference = load_model_source(folder)
    assert loaded.name == path.stem
    assert loaded.path.parent == temp_cache / "models"
    # Every field survives GGUF, including Llama 3 rope scaling rebuilt from rope_freqs.
    assert loaded.config == reference.config
    expected = dict(reference.weights())
    weights = dict(loaded.weights())
    assert set(weights) == set(expected)
    for key, value in expected.items():
        assert weights[key].dtype == torch.float32
        assert torch.equal(weights[key], _stored(value, qtype)), key
    assert loaded.tokenizer.chat_template
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("héllo the world")) == "héllo the world"


@pytest.mark.parametrize("name", ["llama-mha-untied", "llama3-rope", "qwen3-qk-norm"])
def test_converted_folder_runs_like_the_original_in_transformers(
    name: str, tiny_gguf, temp_cache: Path
) -> None:
    """Un-permuted q/k and the rebuilt rope scaling give the original model's logits."""
    from transformers import AutoModelForCausalLM

    folder, path = tiny_gguf(name, gguf.GGMLQuantizationType.F32)
    converted = AutoModelForCausalLM.from_pretrained(prepare_model(path, progress=False))
    original = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.randint(0, TINY_VOCAB_SIZE, (1, 80), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, original(ids).logits, rtol=0, atol=1e-5)


def test_cache_reuse_and_reconversion(tiny_gguf, temp_cache: Path, monkeypatch) -> None:
    _, source = tiny_gguf("llama-mha-untied", gguf.GGMLQuantizationType.F32)
    calls: list[Path] = []
    real_convert = model_cache.convert_gguf_to_hf_folder

    def counting_convert(gguf_path, folder, **kwargs):
        calls.append(folder)
        return real_convert(gguf_path, folder, **kwargs)

    monkeypatch.setattr(model_cache, "convert_gguf_to_hf_folder", counting_convert)
    first = prepare_model(source, progress=False)
    assert len(calls) == 1
    marker = cache_layout.read_marker(first)
    assert marker is not None
    assert marker["source"]["size"] == source.stat().st_size
    assert prepare_model(source, progress=False) == first
    assert len(calls) == 1  # reused

    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert prepare_model(source, progress=False) == first
    assert len(calls) == 1  # touched, same content: still reused
    with source.open("r+b") as f:  # new content at the end of the file (a tensor's data)
        f.seek(-4, os.SEEK_END)
        f.write(b"\x01\x02\x03\x04")
    assert prepare_model(source, progress=False) == first
    assert len(calls) == 2  # the source changed: converted again, into the same place
    assert cache_layout.is_prepared(first, source)
    assert sorted(p.name for p in first.parent.iterdir() if not p.name.endswith(".lock")) == [
        first.name
    ]


def test_crash_mid_conversion_leaves_nothing_that_looks_complete(
    tiny_gguf, temp_cache: Path, monkeypatch
) -> None:
    _, source = tiny_gguf("llama-mqa", gguf.GGMLQuantizationType.Q8_0)
    real_write = model_cache.write_safetensors_streaming

    def crash(path, layout, tensors, **kwargs):
        # A partial file, then a crash.
        real_write(path, layout[:2], itertools.islice(tensors, 2), **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(model_cache, "write_safetensors_streaming", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare_model(source, progress=False)
    models = temp_cache / "models"
    assert [p for p in models.iterdir() if not p.name.endswith(".lock")] == []

    # A folder without a marker (say, from an older crash) is replaced, not trusted.
    monkeypatch.setattr(model_cache, "write_safetensors_streaming", real_write)
    target = resolve_model(source).cache_dir
    assert target is not None
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    folder = prepare_model(source, progress=False)
    assert folder == target
    assert cache_layout.read_marker(folder) is not None
    assert load_model_source(source).config.num_key_value_heads == 1


def test_unsupported_gguf_architecture(tiny_gguf, tmp_path: Path) -> None:
    folder, _ = tiny_gguf("llama-mha-untied", gguf.GGMLQuantizationType.F32)
    path = write_gguf_from_hf(folder, tmp_path / "gemma.gguf", architecture="gemma")
    with pytest.raises(UnsupportedModelError, match="gemma"):
        gguf_file.read_gguf_config(path)


def test_garbage_gguf_is_refused_without_leftovers(tmp_path: Path, temp_cache: Path) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(UnsupportedModelError, match="not a readable GGUF"):
        load_model_source(path)
    assert [p for p in (temp_cache / "models").iterdir() if not p.name.endswith(".lock")] == []


def test_undequantisable_tensor_type_is_refused(tiny_gguf, monkeypatch) -> None:
    _, path = tiny_gguf("llama-mqa", gguf.GGMLQuantizationType.Q8_0)

    def refuse(data, qtype):
        raise NotImplementedError(qtype.name)

    monkeypatch.setattr(gguf_file, "dequantize", refuse)
    with pytest.raises(UnsupportedModelError, match="cannot dequantise"):
        gguf_file.read_gguf_config(path)


def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tiny_gguf) -> None:
    _, path = tiny_gguf("llama3-rope", gguf.GGMLQuantizationType.F32)
    assert (
        gguf_file.read_gguf_config(path).rope_scaling == TINY_MODELS["llama3-rope"]["rope_scaling"]
    )
    # Meta's Llama 3.1 parameters (head_dim 128, theta 5e5, original 8192) round-trip too.
    from helpers.tiny_gguf import llama3_rope_freqs

    from kvrelay_worker.loading import gguf_rope

    meta = {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    divisors = llama3_rope_freqs(meta, 500000.0, 128).astype(np.float64)
    recovered = gguf_rope._llama3_rope_from_divisors(divisors, 500000.0, 128, None, path)
    assert recovered == {"rope_type": "llama3", **meta}


# --- SmolLM2-135M-Instruct, the real default model -----------------------------------


def test_smollm2_config(smollm2_folder: Path) -> None:
    loaded = load_model_source(SMOLLM2)
    assert loaded.name == SMOLLM2
    assert loaded.path == smollm2_folder
    c = loaded.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (
        49152,
        576,
        1536,
        30,
    )
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert c.rope_theta == 100000.0
    assert c.rope_scaling is None
    assert c.rms_norm_eps == 1e-5
    assert c.max_position_embeddings == 8192
    assert c.tie_word_embeddings
    assert not c.attention_bias
    assert not c.mlp_bias
    assert (c.bos_token_id, c.eos_token_ids, c.pad_token_id) == (1, (2,), 2)
    assert c.model_type == "llama"


def test_smollm2_prepare_reuses_the_cache(smollm2_folder: Path, monkeypatch) -> None:
    def no_conversion(*args, **kwargs):
        raise AssertionError("a prepared model must not be converted again")

    monkeypatch.setattr(model_cache, "convert_gguf_to_hf_folder", no_conversion)
    assert prepare_model(SMOLLM2, progress=False) == smollm2_folder


@pytest.mark.slow
def test_smollm2_weights_match_transformers_gguf_loader(
    smollm2_gguf: Path, smollm2_folder: Path
) -> None:
    """Our dequantisation and q/k un-permutation equal transformers' own GGUF loader, and
    transformers loads the converted folder to the very same weights."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    reference = AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32
    ).state_dict()
    weights = dict(load_model_source(SMOLLM2).weights())
    assert set(reference) - set(weights) == {"lm_head.weight"}  # tied: not yielded
    assert set(weights) <= set(reference)
    for key, value in weights.items():
        assert torch.equal(value, reference[key]), key

    from_folder = AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32)
    assert from_folder.config.tie_word_embeddings
    for key, value in from_folder.state_dict().items():
        assert torch.equal(value, reference[key]), key


def test_smollm2_tokenizer_matches_transformers_gguf_tokenizer(
    smollm2_gguf: Path, smollm2_folder: Path
) -> None:
    cached = load_model_source(SMOLLM2).tokenizer
    direct = load_tokenizer(smollm2_gguf)  # from the GGUF (= transformers': test_gguf_tokenizer)
    assert len(cached) == len(direct) == 49152
    assert cached.chat_template
    assert cached.chat_template == direct.chat_template
    assert (cached.bos_token, cached.eos_token, cached.pad_token) == (
        direct.bos_token,
        direct.eos_token,
        direct.pad_token,
    )
    for text in TEXTS:
        ids = cached.encode(text)
        assert ids == direct.encode(text), text
        assert cached.decode(ids) == direct.decode(ids) == text
    for generation_prompt in (False, True):
        rendered = cached.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=generation_prompt
        )
        assert rendered == direct.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=generation_prompt
        )
    assert rendered.endswith("<|im_start|>assistant\n")
