"""The engine's model (and a draft's): built from its files as the config says.

Float weights at the config's dtype and device, or quantized: ``int8``/``int4`` from the
float weights, ``gguf`` keeping a GGUF file's quantized blocks, ``auto`` choosing between
``gguf`` and float weights by source and device. The engine and the draft
model go through the same door, so a draft is built exactly as a target would be.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.errors import EngineConfigError
from kvrelay_worker.engine.kv.max_model_len import default_max_len
from kvrelay_worker.engine.spec.draft_model import split_draft_quantization
from kvrelay_worker.loading import PREQUANTIZED_KEY
from kvrelay_worker.models.decoder import CausalLM
from kvrelay_worker.models.factory import build_model
from kvrelay_worker.models.quantize_model import weight_bytes
from kvrelay_worker.models.quantized_linear import FusedQuantizedLinear

if TYPE_CHECKING:
    from kvrelay_worker.loading import LoadedModelFiles

log = logging.getLogger(__name__)


def eos_token_ids_of(model: CausalLM, tokenizer: Any) -> tuple[int, ...]:
    """The model's end-of-sequence ids and the tokenizer's, sorted, each once."""
    ids = set(model.config.eos_token_ids)
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(tok_eos, int):
        ids.add(tok_eos)
    return tuple(sorted(ids))


def resolve_quantization(config: EngineConfig, source_kind: str) -> str:
    """``config.quantization`` with ``auto`` decided: a GGUF file on CPU keeps its quantized
    blocks (``gguf``: several times float32's decode speed at a sixth of the memory,
    ``benchmarks/vs_llamacpp.py``), anything else gets float weights (``none``)."""
    method = config.weight_quantization
    if method != "auto":
        return method
    return "gguf" if source_kind == "gguf" and config.torch_device.type == "cpu" else "none"


def build_model_for(config: EngineConfig, files: LoadedModelFiles, max_len: int) -> CausalLM:
    """The model with float weights, or quantized as ``config.quantization`` says."""
    method = resolve_quantization(config, files.source.kind)
    if PREQUANTIZED_KEY in files.config.extra:
        return _build_prequantized_model(config, files, max_len, method)
    if method == "gguf":
        return _build_gguf_model(config, files, max_len)
    model = build_model(files.config, files.weights(), config.torch_dtype,
                        config.torch_device, max_position=max_len,
                        quantization=method if method in ("int8", "int4") else "none",
                        group_size=config.quantization_group_size, weights_owned=True)
    log.info("model weights: %.1f MiB (%s)", weight_bytes(model) / 2**20,
             "float" if method == "none" else method)
    return model


def _build_gguf_model(config: EngineConfig, files: LoadedModelFiles,
                      max_len: int) -> CausalLM:
    """Read the GGUF file itself, its quantized blocks kept (``gguf_quantized_model``)."""
    from kvrelay_worker.loading import build_gguf_quantized_model

    if files.source.kind != "gguf":
        raise EngineConfigError(
            f"quantization='gguf' keeps a GGUF file's quantized blocks, but "
            f"{files.name!r} is a Hugging Face folder; use int8 or int4 to quantize it"
        )
    model, formats = build_gguf_quantized_model(
        files.gguf_checkpoint(), config.torch_dtype, config.torch_device, max_len,
        progress=files.progress)
    counts: dict[str, int] = {}
    for fmt in formats.values():
        key = f"{fmt.gguf_type} {fmt.how}"
        counts[key] = counts.get(key, 0) + 1
    split = sum(isinstance(module, FusedQuantizedLinear) for module in model.modules())
    apart = f"; {split} fused layers of mixed types run per shard type" if split else ""
    log.info("model weights: %.1f MiB kept from GGUF (%s%s)", weight_bytes(model) / 2**20,
             ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), apart)
    return model


def _build_prequantized_model(config: EngineConfig, files: LoadedModelFiles, max_len: int,
                              method: str) -> CausalLM:
    """A published quantized checkpoint (compressed-tensors, GPTQ, AWQ), its integer weights kept."""
    from kvrelay_worker.loading import build_prequantized_model

    scheme = files.config.extra[PREQUANTIZED_KEY]
    if method != "none":
        raise EngineConfigError(
            f"{files.name!r} is already quantized ({scheme.describe()}) and is served as "
            f"stored; quantization={method!r} applies to float checkpoints only: use "
            "'none' or 'auto'"
        )
    model = build_prequantized_model(files.path, config.torch_dtype, config.torch_device,
                                     max_len, files.config, progress=files.progress)
    log.info("model weights: %.1f MiB kept as stored (%s)",
             weight_bytes(model) / 2**20, scheme.describe())
    return model


def draft_weights(config: EngineConfig, model: CausalLM,
                  draft_model: CausalLM | None) -> CausalLM | None:
    """The draft model for ``draft:...`` (given, or loaded now: before the KV pools are
    sized, which must count its weights and its own pool); None otherwise."""
    if config.speculative_method != "draft" or draft_model is not None:
        return draft_model
    max_len = default_max_len(config, model.config.max_position_embeddings)
    return load_draft_model(config.speculative_draft_model or "draft", config, max_len)


def load_draft_model(name: str, config: EngineConfig, max_len: int) -> CausalLM:
    """The draft's weights alone, loaded before the KV pools are sized so that the memory
    they take is counted. A suffix ``@int8``, ``@int4`` or ``@gguf`` quantizes them that
    way (``draft:<the target>@int4``: a self-draft, no second download)."""
    from kvrelay_worker.loading import load_model_source

    model_name, quantization = split_draft_quantization(name)
    files = load_model_source(model_name)
    draft_config = dataclasses.replace(config, model=model_name, speculative="off",
                                       quantization=quantization)
    return build_model_for(draft_config, files, max_len)
