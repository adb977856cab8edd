"""How many KV blocks the pool gets, and how many the host pool for swapped-out blocks.

CPU: ``kv_cache_memory`` bytes. CUDA: what is left of ``gpu_memory_utilization`` of the
device after the weights, everything else already resident, and the measured peak of a
dummy forward pass at ``max_num_batched_tokens`` (plus sampling over ``max_num_seqs``
rows), so start-up never over-allocates. A draft model's weights are loaded before this
and its pool (as many blocks as the target's) is paid from the same budget.
``num_kv_blocks`` overrides both.
"""

from __future__ import annotations

import gc
import logging

import torch

from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.errors import EngineConfigError
from kvrelay_worker.engine.runner.model_runner import ModelRunner, kv_bytes_per_block

log = logging.getLogger(__name__)

# Head-room for CUDA graphs' private pools and allocator fragmentation.
_CUDA_RESERVE_BYTES = 512 << 20


def decide_num_blocks(config: EngineConfig, runner: ModelRunner,
                      draft_bytes_per_block: int = 0) -> int:
    """Blocks of the target's pool; a draft model's pool has as many, so with one each
    block costs the draft's bytes too (``draft_bytes_per_block``) and the two pools
    together stay within the budget."""
    per_block = kv_bytes_per_block(runner.model, config.block_size,
                                   config.torch_kv_cache_dtype) + draft_bytes_per_block
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if runner.device.type != "cuda":
        blocks = config.kv_cache_memory // per_block
        if blocks < 1:
            raise EngineConfigError(
                f"kv_cache_memory={config.kv_cache_memory} bytes holds no block "
                f"({per_block} bytes each)"
            )
        return int(blocks)
    return _cuda_blocks(config, runner, per_block)


def _cuda_blocks(config: EngineConfig, runner: ModelRunner, per_block: int) -> int:
    device = runner.device
    gc.collect()  # engines dropped earlier in this process give their memory back first
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    runner.profile_run(config.max_num_batched_tokens, config.max_num_seqs)
    torch.cuda.synchronize(device)
    activation_peak = torch.cuda.max_memory_allocated(device) - base
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    used = total - free
    budget = int(total * config.gpu_memory_utilization) - used - activation_peak
    budget -= _CUDA_RESERVE_BYTES
    blocks = budget // per_block
    log.info(
        "KV sizing: device %.1f GiB, in use %.1f GiB, activation peak %.2f GiB -> %d blocks "
        "(%.1f GiB)", total / 2**30, used / 2**30, activation_peak / 2**30, blocks,
        blocks * per_block / 2**30,
    )
    if blocks < 1:
        raise EngineConfigError(
            f"no GPU memory left for the KV cache at gpu_memory_utilization="
            f"{config.gpu_memory_utilization}: raise it or lower max_num_batched_tokens"
        )
    return int(blocks)


def decide_num_swap_blocks(config: EngineConfig, runner: ModelRunner) -> int:
    """Host blocks for swap preemption: ``swap_space_gib`` worth, none for recompute only."""
    if config.preemption_mode == "recompute":
        return 0
    if config.num_swap_blocks is not None:
        return config.num_swap_blocks
    per_block = kv_bytes_per_block(runner.model, config.block_size,
                                   config.torch_kv_cache_dtype)
    blocks = int(config.swap_space_gib * 2**30) // per_block
    if blocks < 1 and config.preemption_mode == "swap":
        raise EngineConfigError(
            f"swap_space_gib={config.swap_space_gib} holds no KV block ({per_block} bytes "
            "each); raise it or use preemption_mode='auto' or 'recompute'"
        )
    return blocks
