"""The inference engine: paged KV cache, continuous batching, sampling, detokenisation."""

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
    StepOutput,
    TokenLogprob,
)
from kvrelay_worker.engine.sampling_params import SamplingParams

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
    "SamplingParams",
    "SamplingParamsError",
    "StepOutput",
    "TokenLogprob",
]
