"""The engine's counters as one flat dict: what the worker logs and exports as metrics."""

from __future__ import annotations

from typing import Any

from kvrelay_worker.engine.kv.kv_cache import KVCacheManager
from kvrelay_worker.engine.sched.scheduler import Scheduler
from kvrelay_worker.engine.spec.speculator import Speculator


def engine_stats(scheduler: Scheduler, kv: KVCacheManager, speculator: Speculator | None,
                 *, requests: int, steps: int, weight_bytes: int, max_model_len: int,
                 block_size: int) -> dict[str, Any]:
    """Queue, pool, prefix-cache, preemption and speculation figures, and the engine's
    own counts (requests held, steps run) and sizes as given."""
    s = scheduler.stats
    swap = scheduler.swap
    total = kv.num_blocks
    free = kv.num_free_blocks
    return {
        "running": scheduler.num_running,
        "waiting": scheduler.num_waiting,
        "requests": requests,
        "free_blocks": free,
        "total_blocks": total,
        "kv_usage": (total - free) / total if total else 0.0,
        "prefix_cache_hits": s.prefix_cache_hits,
        "prefix_cache_queries": s.prefix_cache_queries,
        "prefix_cache_hit_rate": (
            s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0
        ),
        "prefill_waits": s.prefill_waits,
        "preemptions": s.preemptions,
        "swaps_out": s.swaps_out,
        "swaps_in": s.swaps_in,
        "recomputes": s.recomputes,
        "swapped": scheduler.num_swapped,
        "free_swap_blocks": swap.num_free_blocks if swap is not None else 0,
        "total_swap_blocks": swap.num_blocks if swap is not None else 0,
        "max_batch_size": s.max_batch_size,
        "steps": steps,
        "weight_bytes": weight_bytes,
        "max_model_len": max_model_len,
        "block_size": block_size,
        **(speculator.stats.as_dict() if speculator is not None else {}),
    }
