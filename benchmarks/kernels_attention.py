"""Paged decode attention's achieved bandwidth beside a device-to-device copy's, on CUDA.

Decode attention is bound by reading the KV cache, so its yardstick is the device's own
copy bandwidth measured in the same run (absolute numbers drift on shared machines).

Counting, stated in every row:
- attention: bytes of K and V it must read (``batch * context * kv_heads * head * 2``
  elements); queries, block tables and outputs are negligible and not counted;
- copy: bytes read plus bytes written (a copy of N bytes moves 2N through DRAM), so both
  numbers are DRAM traffic per second.

Attention is timed two ways: ``graph`` replays a CUDA graph of calls (how the engine runs
decode; no launch overhead) and ``eager`` uses ``triton.testing.do_bench`` (launches
included, L2 flushed between calls). Calls rotate over several copies of the cache when
one is small, so consecutive calls do not hit data left in L2. Block tables are shuffled
so blocks sit where a long-running server would put them. Needs CUDA; imports without it.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

# Bytes of KV cache touched between two reads of the same block: several L2s' worth.
_ROTATION_BYTES = 512 * 2**20
_MAX_ROTATIONS = 16
_COPY_BYTES = 2 * 2**30  # the copy benchmark's source buffer (the destination is as big)
_MEMORY_HEADROOM = 0.9  # use at most this fraction of free device memory


def _time_graph_ms(calls: Sequence[Callable[[], object]], replays: int = 20) -> float:
    """Median time of one call, replaying a graph that runs every call once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(calls))
    return statistics.median(times)


def _copier(dst: torch.Tensor, src: torch.Tensor) -> Callable[[], object]:
    return lambda: dst.copy_(src)


def _rotating(calls: Sequence[Callable[[], object]]) -> Callable[[], object]:
    """Each invocation runs the next call, so consecutive calls read different caches."""
    turn = itertools.cycle(calls)
    return lambda: next(turn)()


def measure_copy_bandwidth(num_bytes: int = _COPY_BYTES) -> dict[str, Any]:
    """Device-to-device ``Tensor.copy_`` bandwidth, counting bytes read plus written."""
    import triton.testing

    free, _ = torch.cuda.mem_get_info()
    num_bytes = min(num_bytes, int(free * _MEMORY_HEADROOM) // 2)
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(_copier(dst, src), warmup=50, rep=500, return_mode="median")
    moved = 2 * num_bytes
    return {"copy_buffer_bytes": num_bytes, "copy_time_us": ms * 1e3,
            "copy_gbps": moved / (ms * 1e-3) / 1e9, "copy_bytes_counted": "read+write"}


def _attention_bytes(batch: int, context: int, num_kv_heads: int, head_size: int,
                     dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * batch * context * num_kv_heads * head_size * itemsize


def _decode_calls(
    batch: int, context: int, num_heads: int, num_kv_heads: int, head_size: int,
    block_size: int, dtype: torch.dtype, rotations: int,
) -> list[Callable[[], object]]:
    """One decode call per cache copy, each over its own shuffled blocks."""
    from kvrelay_kernels import paged_attention

    blocks_per_seq = math.ceil(context / block_size)
    blocks = batch * blocks_per_seq * rotations
    shape = (blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.empty(shape, dtype=dtype, device="cuda").normal_()
    value_cache = torch.empty(shape, dtype=dtype, device="cuda").normal_()
    order = torch.randperm(blocks, device="cuda", dtype=torch.int64).to(torch.int32)
    tables = order.view(rotations, batch, blocks_per_seq)
    query = torch.randn(batch, num_heads, head_size, dtype=dtype, device="cuda")
    out = torch.empty_like(query)
    starts = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    scale = head_size**-0.5

    def call(table: torch.Tensor) -> Callable[[], object]:
        return lambda: paged_attention(query, key_cache, value_cache, table, starts, seq_lens,
                                       scale, max_query_len=1, max_seq_len=context, out=out)

    return [call(tables[r]) for r in range(rotations)]


def _num_splits(batch: int, context: int, num_heads: int, num_kv_heads: int,
                head_size: int, block_size: int, dtype: torch.dtype) -> int:
    from kvrelay_kernels.triton_kernels.launch_config import decode_config

    return decode_config(num_seqs=batch, num_heads=num_heads, num_kv_heads=num_kv_heads,
                         head_size=head_size, block_size=block_size, max_seq_len=context,
                         dtype=dtype, device=torch.device("cuda")).num_splits


def run_attention_benchmark(
    batches: Sequence[int] = (1, 16, 64, 256),
    contexts: Sequence[int] = (512, 4096, 32768),
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_size: int = 128,
    block_size: int = 16,
    dtype: torch.dtype = torch.bfloat16,
) -> list[dict[str, Any]]:
    """One row per (batch, context): attention bandwidth, copy bandwidth and their ratio.

    Configurations whose cache does not fit in free device memory come back with a
    ``skipped`` reason instead of timings.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("the attention benchmark needs a CUDA device")
    import triton.testing

    from kvrelay_kernels.triton_kernels import launch_config

    tuning = {"decode_max_splits": launch_config.DECODE_MAX_SPLITS,
              "decode_programs_per_sm": launch_config.DECODE_PROGRAMS_PER_SM,
              "decode_tile_n": launch_config.DECODE_TILE_N,
              "decode_num_stages": launch_config.DECODE_NUM_STAGES}
    copy = measure_copy_bandwidth()
    torch.cuda.empty_cache()
    rows: list[dict[str, Any]] = []
    for context in contexts:
        for batch in batches:
            kv_bytes = _attention_bytes(batch, context, num_kv_heads, head_size, dtype)
            row: dict[str, Any] = {
                "batch": batch, "context": context, "num_heads": num_heads,
                "num_kv_heads": num_kv_heads, "head_size": head_size,
                "block_size": block_size, "dtype": str(dtype).removeprefix("torch."),
                "kv_bytes_read": kv_bytes, "attention_bytes_counted": "K+V read", **tuning, **copy,
            }
            rows.append(row)
            free, _ = torch.cuda.mem_get_info()
            rotations = max(1, min(_MAX_ROTATIONS, math.ceil(_ROTATION_BYTES / kv_bytes)))
            if kv_bytes * rotations > free * _MEMORY_HEADROOM:
                rotations = 1
            if kv_bytes > free * _MEMORY_HEADROOM:
                row["skipped"] = f"needs {kv_bytes / 2**30:.1f} GiB, {free / 2**30:.1f} free"
                continue
            calls = _decode_calls(batch, context, num_heads, num_kv_heads, head_size,
                                  block_size, dtype, rotations)
            graph_ms = _time_graph_ms(calls)
            eager_ms = triton.testing.do_bench(_rotating(calls), warmup=25, rep=200,
                                               return_mode="median")
            row.update({
                "num_splits": _num_splits(batch, context, num_heads, num_kv_heads, head_size,
                                          block_size, dtype),
                "rotations": rotations,
                "graph_time_us": graph_ms * 1e3,
                "eager_time_us": eager_ms * 1e3,
                "graph_gbps": kv_bytes / (graph_ms * 1e-3) / 1e9,
                "eager_gbps": kv_bytes / (eager_ms * 1e-3) / 1e9,
            })
            row["graph_ratio"] = row["graph_gbps"] / copy["copy_gbps"]
            row["eager_ratio"] = row["eager_gbps"] / copy["copy_gbps"]
            del calls
            torch.cuda.empty_cache()
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table of the rows (GB/s are 1e9 bytes per second)."""
    head = (f"{'batch':>5} {'context':>7} {'splits':>6} {'graph us':>9} {'graph GB/s':>10} "
            f"{'ratio':>6} {'eager us':>9} {'eager GB/s':>10} {'ratio':>6}")
    lines = [head]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['batch']:>5} {r['context']:>7}  skipped: {r['skipped']}")
            continue
        lines.append(
            f"{r['batch']:>5} {r['context']:>7} {r['num_splits']:>6} {r['graph_time_us']:>9.1f} "
            f"{r['graph_gbps']:>10.0f} {r['graph_ratio']:>6.2f} {r['eager_time_us']:>9.1f} "
            f"{r['eager_gbps']:>10.0f} {r['eager_ratio']:>6.2f}"
        )
    if rows:
        lines.append(f"copy: {rows[0]['copy_gbps']:.0f} GB/s counting bytes read+written; "
                     "attention counts K+V bytes read")
    return "\n".join(lines)


def _override_decode_tuning(programs_per_sm: int | None, tile_n: int | None,
                            num_stages: int | None, max_splits: int | None = None) -> None:
    """Set the decode kernel's tuning knobs for this process (for a sweep by hand)."""
    from kvrelay_kernels.triton_kernels import launch_config

    if max_splits is not None:
        launch_config.DECODE_MAX_SPLITS = max_splits
    if programs_per_sm is not None:
        launch_config.DECODE_PROGRAMS_PER_SM = programs_per_sm
    if tile_n is not None:
        launch_config.DECODE_TILE_N = tile_n
    if num_stages is not None:
        launch_config.DECODE_NUM_STAGES = num_stages


def main(argv: Sequence[str] | None = None) -> None:
    """``python benchmarks/kernels_attention.py [--batches 1 16] [--contexts 4096] [--json F]``."""
    import argparse

    from harness import write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 4096, 32768])
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--programs-per-sm", type=int, help="override the split heuristic")
    parser.add_argument("--tile-n", type=int, help="override the decode tile (tokens)")
    parser.add_argument("--num-stages", type=int, help="override the decode pipeline depth")
    args = parser.parse_args(argv)
    _override_decode_tuning(args.programs_per_sm, args.tile_n, args.num_stages)
    rows = run_attention_benchmark(batches=args.batches, contexts=args.contexts)
    print(format_table(rows))
    if args.json:
        write_result(args.json, "kernels_attention", args, {"rows": rows})


if __name__ == "__main__":
    main()
