"""Decode attention over a quantized KV cache against bfloat16, on CUDA (Triton kernels).

Issue 17's goal: FP8-KV decode attention at least 1.7x the bfloat16 one at 32k context.
One decode token per sequence, Llama-3-8B's attention shape (32 query heads over 8 KV
heads, head size 128, block size 16), shuffled block tables; each configuration is timed
with ``triton.testing.do_bench`` (median, L2 flushed between calls) in the same run, and
the table reports each one's time and speed-up over bfloat16. Needs CUDA.

    python benchmarks/kv_quant_decode_gpu.py [--batches 1 8] [--contexts 4096 32768]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch
from harness import write_result

HEADS, KV_HEADS, HEAD, BLOCK = 32, 8, 128, 16
GOAL_FP8_SPEEDUP = 1.7


def time_decode(batch: int, context: int, kv_dtype: torch.dtype) -> float:
    """Median milliseconds of one decode attention call over ``batch`` x ``context``."""
    import triton.testing

    from kvrelay_kernels import paged_attention, store_kv_cache
    from kvrelay_kernels.kv_quant import kv_row_size

    device = torch.device("cuda")
    blocks_per_seq = -(-context // BLOCK)
    num_blocks = batch * blocks_per_seq
    row = kv_row_size(HEAD, kv_dtype)
    shape = (num_blocks, BLOCK, KV_HEADS, row)
    key_cache = torch.empty(shape, dtype=kv_dtype, device=device)
    value_cache = torch.empty(shape, dtype=kv_dtype, device=device)
    # Fill through the store kernel so quantized rows carry real scales.
    chunk = 1 << 16
    for start in range(0, num_blocks * BLOCK, chunk):
        slots = torch.arange(start, min(start + chunk, num_blocks * BLOCK), device=device)
        kv = torch.randn((slots.numel(), KV_HEADS, HEAD), dtype=torch.bfloat16, device=device)
        store_kv_cache(kv, kv, key_cache, value_cache, slots)
    tables = torch.randperm(num_blocks, device=device).view(batch, blocks_per_seq).int()
    query = torch.randn((batch, HEADS, HEAD), dtype=torch.bfloat16, device=device)
    starts = torch.arange(batch + 1, dtype=torch.int32, device=device)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    out = torch.empty_like(query)

    def call() -> None:
        paged_attention(query, key_cache, value_cache, tables, starts, lens, HEAD**-0.5,
                        max_query_len=1, max_seq_len=context, out=out)

    ms: float = triton.testing.do_bench(call, warmup=25, rep=200)
    return ms


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--out", default="benchmarks/results/kv_quant_decode_gpu.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    dtypes = {"bfloat16": torch.bfloat16, "int8": torch.int8,
              "fp8_e4m3": torch.float8_e4m3fn}
    print(f"{'batch':>6}{'context':>9}" + "".join(f"{n + ' ms':>14}" for n in dtypes)
          + f"{'int8 x':>9}{'fp8 x':>9}")
    rows = []
    for batch in args.batches:
        for context in args.contexts:
            times = {name: time_decode(batch, context, dtype) for name, dtype in dtypes.items()}
            base = times["bfloat16"]
            rows.append({"batch": batch, "context": context,
                         **{f"{name}_ms": t for name, t in times.items()},
                         "int8_speedup": base / times["int8"],
                         "fp8_speedup": base / times["fp8_e4m3"]})
            # Written after every row: a stage cut off by its time limit keeps what ran.
            write_result(args.out, "kv_quant_decode_gpu", args,
                         {"device": torch.cuda.get_device_name(),
                          "goal_fp8_speedup": GOAL_FP8_SPEEDUP, "rows": rows})
            print(f"{batch:>6}{context:>9}" + "".join(f"{t:>14.4f}" for t in times.values())
                  + f"{base / times['int8']:>9.2f}{base / times['fp8_e4m3']:>9.2f}")
            torch.cuda.empty_cache()
    print(f"goal: fp8_e4m3 >= {GOAL_FP8_SPEEDUP}x bfloat16 at 32k context")
    return 0


if __name__ == "__main__":
    sys.exit(main())
