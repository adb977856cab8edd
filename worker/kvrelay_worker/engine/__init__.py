"""The inference engine: paged KV cache, continuous batching, sampling, detokenisation.

The names below load on first use: the torch-free modules of this package (errors,
outputs, prompt, sampling_params, chat) are imported by the worker's request path, and a
simulated worker (``kvrelay_worker.simulated``) must not pay for torch through them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvrelay_worker.engine.config import EngineConfig
    from kvrelay_worker.engine.errors import (
        EngineConfigError,
        EngineInputError,
        InvalidPromptError,
        PromptTooLongError,
        RequestFailedError,
        SamplingParamsError,
    )
    from kvrelay_worker.engine.llm import LLM
    from kvrelay_worker.engine.llm_engine import LLMEngine
    from kvrelay_worker.engine.outputs import (
        ChoiceDelta,
        CompletionChoice,
        RequestOutput,
        SampledLogprob,
        StepOutput,
    )
    from kvrelay_worker.engine.sampling_params import SamplingParams

# Each public name -> the module that defines it.
_HOMES = {
    "LLM": "llm",
    "ChoiceDelta": "outputs",
    "CompletionChoice": "outputs",
    "EngineConfig": "config",
    "EngineConfigError": "errors",
    "EngineInputError": "errors",
    "InvalidPromptError": "errors",
    "LLMEngine": "llm_engine",
    "PromptTooLongError": "errors",
    "RequestFailedError": "errors",
    "RequestOutput": "outputs",
    "SamplingParams": "sampling_params",
    "SamplingParamsError": "errors",
    "StepOutput": "outputs",
    "SampledLogprob": "outputs",
}

__all__ = [
    "LLM",
    "ChoiceDelta",
    "CompletionChoice",
    "EngineConfig",
    "EngineConfigError",
    "EngineInputError",
    "InvalidPromptError",
    "LLMEngine",
    "PromptTooLongError",
    "RequestFailedError",
    "RequestOutput",
    "SampledLogprob",
    "SamplingParams",
    "SamplingParamsError",
    "StepOutput",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'kvrelay_worker.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"kvrelay_worker.engine.{home}"), name)
