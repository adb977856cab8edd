"""Tile sizes and the flash-decoding split count, chosen on the host from shapes alone.

Everything here depends only on tensor shapes, dtypes and host integers, never on device
values, so a launch planned here can be captured in a CUDA graph. The numbers are the
tuning knobs of the attention kernels; they live in one place so a GPU sweep can change
them without touching the kernels.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton

from kvrelay_kernels.checks import KernelArgumentError

# Flash-decoding aims for about this many programs per streaming multiprocessor, so that
# a small batch still spreads its context over the whole device.
DECODE_PROGRAMS_PER_SM = 4
# More splits than this only add reduce work: 64 splits of a 32k context are 512 tokens
# each, already short enough to fill the device at batch 1.
DECODE_MAX_SPLITS = 64
# Context tokens per decode loop iteration for 16-bit caches (halved for float32): 64
# tokens of K and V at head size 128 are 32 KiB in flight per program. Warps and pipeline
# stages of the decode kernel, likewise for 16-bit caches (float32 uses 2 stages).
DECODE_TILE_N = 64
DECODE_NUM_WARPS = 4
DECODE_NUM_STAGES = 3
# Under the CPU interpreter there is no device to fill; a few "SMs" keep tests meaningful
# (several splits for a few-hundred-token context) and fast.
INTERPRETER_SM_COUNT = 4
# The smallest context tile the kernels are planned with (tl.dot needs 16 rows or more).
MIN_TILE_N = 16


@dataclass(frozen=True)
class DecodeConfig:
    """How the split-KV decode kernel walks one sequence's context."""

    tile_n: int  # context tokens per loop iteration (several KV blocks)
    num_splits: int  # programs sharing one (sequence, KV head)'s context
    group_pad: int  # query heads of one KV head, padded for tl.dot (>= 16)
    head_pad: int  # head size padded to a power of two
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class PrefillConfig:
    """How the variable-length prefill kernel tiles queries and context."""

    block_m: int  # rows per program: query tokens x query heads of one KV head
    block_q: int  # query tokens per program (block_m // group)
    tile_n: int  # context tokens per loop iteration
    head_pad: int
    num_warps: int
    num_stages: int


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _sm_count(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (a fixed small number on CPU)."""
    if device.type != "cuda":
        return INTERPRETER_SM_COUNT
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _sm_count(index)


@functools.cache
def _shared_memory_optin(device_index: int) -> int:
    props = torch.cuda.get_device_properties(device_index)
    budget = getattr(props, "shared_memory_per_block_optin", 0)
    return int(budget) or 48 * 1024  # what every CUDA device gives a block by default


def shared_memory_budget(device: torch.device) -> int | None:
    """Bytes of shared memory one program may use on ``device``; None off CUDA."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _shared_memory_optin(index)


def _tile_n(dtype: torch.dtype) -> int:
    """About DECODE_TILE_N tokens' worth of 16-bit data, whatever the KV block size.

    A tile may cover part of a block (every token is gathered through the block table on
    its own), so large blocks do not grow the tile nor the shared memory it needs.
    """
    return DECODE_TILE_N // 2 if dtype == torch.float32 else DECODE_TILE_N


def shared_memory_estimate(tile_n: int, num_stages: int, head_pad: int, dtype: torch.dtype,
                           resident_rows: int) -> int:
    """Bytes a program holds in shared memory: K and V tiles per pipeline stage, plus
    ``resident_rows`` rows of queries. An estimate of what Triton allocates, not a bound."""
    size = dtype.itemsize
    return num_stages * 2 * tile_n * head_pad * size + resident_rows * head_pad * size


def fit_pipeline(tile_n: int, num_stages: int, head_pad: int, dtype: torch.dtype,
                 resident_rows: int, budget: int | None) -> tuple[int, int]:
    """Fewer stages, then smaller tiles, until the estimate fits ``budget`` (None: any).

    Raises ``KernelArgumentError`` when even one stage of the smallest tile does not fit:
    the model's head size and dtype need more shared memory than the device has.
    """
    if budget is None:
        return tile_n, num_stages
    while shared_memory_estimate(tile_n, num_stages, head_pad, dtype, resident_rows) > budget:
        if num_stages > 1:
            num_stages -= 1
        elif tile_n > MIN_TILE_N:
            tile_n //= 2
        else:
            need = shared_memory_estimate(tile_n, 1, head_pad, dtype, resident_rows)
            raise KernelArgumentError(
                f"attention at head size {head_pad} in {str(dtype).removeprefix('torch.')} "
                f"needs about {need} bytes of shared memory per program; this device "
                f"allows {budget}: use a 16-bit dtype"
            )
    return tile_n, num_stages


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, tile_n: int, num_sms: int
) -> int:
    """Split each context into enough pieces that the grid covers the device.

    ``max_seq_len`` only caps the split count (no split is shorter than one tile); each
    program derives its own piece of the real context on the device, so a loose bound
    (a CUDA graph's ``max_model_len``) costs only cheap early exits, never imbalance.
    """
    base = max(1, num_seqs * num_kv_heads)
    wanted = max(1, DECODE_PROGRAMS_PER_SM * num_sms // base)
    useful = max(1, triton.cdiv(max(max_seq_len, 1), tile_n))
    return min(wanted, useful, DECODE_MAX_SPLITS)


@functools.lru_cache(maxsize=256)
def _decode_pipeline(num_heads: int, num_kv_heads: int, head_size: int, dtype: torch.dtype,
                     budget: int | None, tile_n: int, num_stages: int
                     ) -> tuple[int, int, int, int]:
    """``(tile_n, num_stages, group_pad, head_pad)``: what depends on the model and the
    device alone, planned once (every layer of every step asks). The tuning knobs and the
    shared-memory budget are part of the key, so a sweep that changes them re-plans."""
    group_pad = max(16, triton.next_power_of_2(num_heads // num_kv_heads))
    head_pad = triton.next_power_of_2(head_size)
    tile, stages = fit_pipeline(tile_n, num_stages, head_pad, dtype, group_pad, budget)
    return tile, stages, group_pad, head_pad


def decode_config(
    *,
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    max_seq_len: int,
    dtype: torch.dtype,
    device: torch.device,
) -> DecodeConfig:
    tile_n, num_stages, group_pad, head_pad = _decode_pipeline(
        num_heads, num_kv_heads, head_size, dtype, shared_memory_budget(device),
        _tile_n(dtype), 2 if dtype == torch.float32 else DECODE_NUM_STAGES)
    return DecodeConfig(
        tile_n=tile_n,
        num_splits=choose_num_splits(num_seqs, num_kv_heads, max_seq_len, tile_n,
                                     sm_count(device)),
        group_pad=group_pad,
        head_pad=head_pad,
        num_warps=DECODE_NUM_WARPS,
        num_stages=num_stages,
    )


def prefill_config(
    *, num_heads: int, num_kv_heads: int, head_size: int, block_size: int, dtype: torch.dtype,
    device: torch.device,
) -> PrefillConfig:
    return _prefill_plan(num_heads, num_kv_heads, head_size, dtype,
                         shared_memory_budget(device), _tile_n(dtype))


@functools.lru_cache(maxsize=256)
def _prefill_plan(num_heads: int, num_kv_heads: int, head_size: int, dtype: torch.dtype,
                  budget: int | None, tile_n: int) -> PrefillConfig:
    """Planned once per model shape and device: nothing in it changes per step."""
    group = num_heads // num_kv_heads
    block_m = max(64, triton.next_power_of_2(group))
    head_pad = triton.next_power_of_2(head_size)
    tile_n, num_stages = fit_pipeline(tile_n, 2, head_pad, dtype, block_m, budget)
    return PrefillConfig(
        block_m=block_m,
        block_q=block_m // group,
        tile_n=tile_n,
        head_pad=head_pad,
        num_warps=4 if block_m <= 64 else 8,
        num_stages=num_stages,
    )


def check_attention_fits(*, num_heads: int, num_kv_heads: int, head_size: int,
                         block_size: int, dtype: torch.dtype, device: torch.device) -> None:
    """Raise ``KernelArgumentError`` now if the attention kernels cannot run on ``device``
    at these shapes (engines call this at start rather than fail at the first step)."""
    decode_config(num_seqs=1, num_heads=num_heads, num_kv_heads=num_kv_heads,
                  head_size=head_size, block_size=block_size, max_seq_len=1, dtype=dtype,
                  device=device)
    prefill_config(num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
                   block_size=block_size, dtype=dtype, device=device)
