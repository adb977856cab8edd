"""Errors the engine raises for bad input: all ``ValueError`` subclasses, all clear."""

from __future__ import annotations


class EngineInputError(ValueError):
    """Base class: a request or configuration the engine refuses."""


class InvalidPromptError(EngineInputError):
    """Empty prompt, or a token id outside the model's vocabulary."""


class PromptTooLongError(EngineInputError):
    """The prompt leaves no room for output within ``max_model_len``."""


class SamplingParamsError(EngineInputError):
    """A sampling parameter is out of range or of the wrong type."""


class EngineConfigError(EngineInputError):
    """An engine option is invalid or the KV pool cannot hold one full-length sequence."""


class RequestFailedError(RuntimeError):
    """An engine step failed because of this request (found by retrying without it).

    Only this request ends, with this error; the others in the step go on.
    """


class LoraAdapterError(EngineInputError):
    """A LoRA adapter folder the engine cannot load: unreadable, of a kind or shape the
    base model cannot take, or LoRA is off (``EngineConfig.max_loras`` is 0)."""


class LoraNotLoadedError(EngineInputError):
    """A request names a LoRA adapter the engine does not hold (never loaded, or removed)."""
