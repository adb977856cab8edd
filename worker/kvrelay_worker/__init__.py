"""kvrelay's GPU worker: the inference engine and the Celery worker around it.

``from kvrelay_worker import LLM, SamplingParams`` is the offline API. Heavy modules
(torch, transformers) load on first use, so ``import kvrelay_worker`` itself is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvrelay_worker.engine import LLM, EngineConfig, LLMEngine, SamplingParams

__all__ = ["LLM", "EngineConfig", "LLMEngine", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kvrelay_worker import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'kvrelay_worker' has no attribute {name!r}")
