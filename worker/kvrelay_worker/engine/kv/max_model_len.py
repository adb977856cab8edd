"""The longest sequence the engine takes: what the config asks, the model allows, the
KV pool holds and, without chunked prefill, one step's token budget computes."""

from __future__ import annotations

import logging

from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.errors import EngineConfigError

log = logging.getLogger(__name__)


def default_max_len(config: EngineConfig, model_max: int) -> int:
    """``max_model_len`` if set (never beyond the model's positions), else the model's."""
    if config.max_model_len is not None and config.max_model_len > model_max:
        raise EngineConfigError(
            f"max_model_len {config.max_model_len} exceeds the model's "
            f"{model_max} positions"
        )
    return config.max_model_len or model_max


def tokens_held(config: EngineConfig, max_len: int, window: int | None) -> int:
    """The most KV slots one sequence can hold at once: the pool must fit that.

    Normally its whole length; when every layer has a window and prompts are
    chunked, only the window plus one step's chunk (and a block of slack on each
    side), since blocks behind the window are released as it advances.
    """
    if window is None or not config.enable_chunked_prefill:
        return max_len
    bs = config.block_size
    windowed = (-(-(window - 1 + config.max_num_batched_tokens) // bs) + 1) * bs
    return min(max_len, windowed)


def fit_max_model_len(config: EngineConfig, model_max: int, window: int | None,
                      num_blocks: int) -> int:
    """The default length, lowered (with a warning) to what the pool and the step budget
    allow; an explicit ``max_model_len`` that does not fit is refused instead."""
    capacity = num_blocks * config.block_size
    max_len = default_max_len(config, model_max)
    if capacity < tokens_held(config, max_len, window):
        if config.max_model_len is not None:
            raise EngineConfigError(
                f"the KV pool holds {capacity} tokens ({num_blocks} blocks), fewer than "
                f"max_model_len={max_len}; give it more memory or lower max_model_len"
            )
        log.warning("max_model_len lowered from %d to the KV pool's %d tokens",
                    max_len, capacity)
        max_len = capacity
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_len:
        # Without chunking a prompt (or a preempted sequence's recompute) runs in one
        # step; a longer one could never be scheduled and would wait forever.
        if config.max_model_len is not None:
            raise EngineConfigError(
                f"with chunked prefill off, max_num_batched_tokens "
                f"({config.max_num_batched_tokens}) must be at least max_model_len "
                f"({max_len}); raise it, lower max_model_len or enable chunked prefill"
            )
        log.warning("max_model_len lowered from %d to max_num_batched_tokens=%d "
                    "(chunked prefill is off)", max_len, config.max_num_batched_tokens)
        max_len = config.max_num_batched_tokens
    return max_len
