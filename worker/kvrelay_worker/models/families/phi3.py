"""Phi-3: Llama's layout; its checkpoints already store q/k/v and gate/up fused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvrelay_worker.models.family import ModelFamily, every_layer, sliding_fields


def _fields(raw: Mapping[str, Any], layers: int, source: str) -> dict[str, Any]:
    # Every layer windows when the config sets one (Phi-3-mini-4k: 2047).
    return sliding_fields(raw, layers, every_layer)


PHI3 = ModelFamily("phi3", "Phi-3", ("Phi3ForCausalLM",), ("phi3",), _fields,
                   default_max_positions=4096, formats=("safetensors", "gguf"),
                   examples="Phi-3-mini-4k-instruct")
