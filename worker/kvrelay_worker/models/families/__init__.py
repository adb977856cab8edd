"""Every model family the decoder runs; ``family_of`` finds one by name or config."""

from __future__ import annotations

from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.models.families.gemma import GEMMA2, GEMMA3
from kvrelay_worker.models.families.llama import LLAMA, MISTRAL, QWEN2
from kvrelay_worker.models.families.moe import MIXTRAL, QWEN3_MOE
from kvrelay_worker.models.families.phi3 import PHI3
from kvrelay_worker.models.families.qwen3 import QWEN3
from kvrelay_worker.models.family import ModelFamily

FAMILIES: tuple[ModelFamily, ...] = (LLAMA, MISTRAL, QWEN2, QWEN3, PHI3, GEMMA2, GEMMA3,
                                     MIXTRAL, QWEN3_MOE)
_BY_NAME = {family.name: family for family in FAMILIES}
_BY_ARCHITECTURE = {arch: family for family in FAMILIES for arch in family.architectures}
_BY_HF_TYPE = {kind: family for family in FAMILIES for kind in family.hf_model_types}


def family_of(model_type: str) -> ModelFamily:
    """The family a ``ModelConfig.model_type`` names."""
    if model_type not in _BY_NAME:
        raise UnsupportedModelError(
            f"model type {model_type!r} is not supported (supported: {', '.join(_BY_NAME)})"
        )
    return _BY_NAME[model_type]


def family_of_hf_config(architectures: list[str], model_type: object,
                        source: str) -> ModelFamily:
    """The family of a config.json: by its first architecture, else by its model_type."""
    if architectures:
        arch = architectures[0]
        if arch not in _BY_ARCHITECTURE:
            raise UnsupportedModelError(
                f"{source}: architecture {arch} is not supported "
                f"(supported: {', '.join(_BY_ARCHITECTURE)})"
            )
        return _BY_ARCHITECTURE[arch]
    if not isinstance(model_type, str) or model_type not in _BY_HF_TYPE:
        raise UnsupportedModelError(
            f"{source}: model_type {model_type!r} is not supported "
            f"(supported: {', '.join(_BY_HF_TYPE)})"
        )
    return _BY_HF_TYPE[model_type]


__all__ = ["FAMILIES", "ModelFamily", "family_of", "family_of_hf_config"]
