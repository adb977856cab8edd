"""What a model family is to the engine, and the config.json readers families share.

A family is one small module in ``models/families``: the Hugging Face architecture names
it answers to, and a function reading its own config.json keys into ``ModelConfig``
switches. The decoder (``CausalLM``) and the loading code need nothing else, so adding a
family is adding a module there and listing it in ``families/__init__.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvrelay_worker.models.errors import UnsupportedModelError

# Reads the family's own keys of a config.json into ModelConfig fields. Arguments: the raw
# dict, the number of layers, and where the config came from (for messages).
FieldReader = Callable[[Mapping[str, Any], int, str], dict[str, Any]]


@dataclass(frozen=True)
class ModelFamily:
    name: str  # the ModelConfig.model_type we keep
    title: str  # for people: "Gemma 2"
    architectures: tuple[str, ...]  # Hugging Face classes (config.json "architectures")
    hf_model_types: tuple[str, ...]  # config.json "model_type" values
    read_fields: FieldReader
    default_max_positions: int
    formats: tuple[str, ...] = ("safetensors",)  # plus "gguf" where the converter has it
    examples: str = ""


def rope_from_hf(raw: Mapping[str, Any], source: str) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, rope_scaling)`` from either transformers 4 or 5 spelling.

    transformers 5 writes ``rope_parameters`` (holding ``rope_theta`` and ``rope_type``,
    ``"default"`` for plain RoPE); 4.x writes ``rope_theta`` and ``rope_scaling`` (whose
    type key was once ``type``). Plain RoPE comes back as ``None``.
    """
    scaling: dict[str, Any] | None = None
    for key in ("rope_parameters", "rope_scaling"):
        value = raw.get(key)
        if isinstance(value, Mapping) and value:
            scaling = dict(value)
            break
    theta = float(raw.get("rope_theta") or 10000.0)
    if scaling is None:
        return theta, None
    if scaling.get("rope_theta") is not None:
        theta = float(scaling["rope_theta"])
    scaling.pop("rope_theta", None)
    legacy_type = scaling.pop("type", None)
    rope_type = scaling.pop("rope_type", None) or legacy_type or "default"
    partial = scaling.pop("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial is not None and float(partial) != 1.0:
        raise UnsupportedModelError(f"{source}: partial rotary embeddings are not supported")
    if rope_type == "default":
        return theta, None
    if "original_max_position_embeddings" not in scaling and raw.get(
        "original_max_position_embeddings"
    ):
        scaling["original_max_position_embeddings"] = raw["original_max_position_embeddings"]
    return theta, {"rope_type": rope_type, **scaling}


def sliding_fields(raw: Mapping[str, Any], layers: int,
                   default: Callable[[int], bool] | None) -> dict[str, Any]:
    """``sliding_window`` and ``sliding_layers`` from ``layer_types`` or the family's rule.

    transformers 5 writes ``layer_types`` (``"sliding_attention"`` per windowed layer);
    older configs leave it out and the family's ``default(layer)`` decides. A config
    without a window (``sliding_window`` null) has no windowed layer.
    """
    window = raw.get("sliding_window")
    if window is None or default is None:
        return {"sliding_window": None, "sliding_layers": ()}
    layer_types = raw.get("layer_types")
    if layer_types is not None:
        if len(layer_types) != layers:
            raise UnsupportedModelError(f"layer_types has {len(layer_types)} entries for "
                                        f"{layers} layers")
        flags = tuple(kind == "sliding_attention" for kind in layer_types)
    else:
        flags = tuple(default(i) for i in range(layers))
    if not any(flags):
        return {"sliding_window": None, "sliding_layers": ()}
    return {"sliding_window": int(window), "sliding_layers": flags}


def every_layer(_layer: int) -> bool:
    return True


def qwen_sliding(raw: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """Qwen2/Qwen3: windows only with ``use_sliding_window``, on layers past
    ``max_window_layers`` (unless ``layer_types`` says otherwise)."""
    if not raw.get("use_sliding_window", False):
        return sliding_fields(raw, layers, None)
    first = int(raw.get("max_window_layers", 28))
    return sliding_fields(raw, layers, lambda i: i >= first)
