"""One layer's CPU attention: the reference (block gather + SDPA) vs the compiled kernels.

Shapes are SmolLM2's (9 query / 3 KV heads of 64, float32, blocks of 16 scattered over a
cache twice the batch's size). Two tables: decode (one new token per sequence, the decode
kernel) from the issue's 48 x 224 tokens up to 16 x 6,144; and prompt chunks (a 512-token
chunk after 0, 2k and 6k tokens of context) and verification queries (16 sequences of 4
or 9 new tokens after 2k), where the tiled kernel runs with its products in sgemm and in
its fallback loops, beside the decode kernel walking the context once per token. Times are
the best of ``--repeats`` calls in *process CPU time* on one thread: on a shared machine
that is the figure other users' load disturbs least (wall time is what
``long_context.py`` reports); ``--threads N`` runs the kernels on N threads and times wall
clock (an idle machine). Prints a table and writes JSON.

    python benchmarks/cpu_attention.py
    python benchmarks/cpu_attention.py --threads 2
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from harness import write_result
from harness.repository import load_repository_module

from kvrelay_kernels.cpu_kernels.paged_attention import (
    cpu_kernel_usable,
    paged_attention_cpu,
    paged_attention_decode_cpu,
    paged_attention_tiled_cpu,
    set_tiled_blas,
)
from kvrelay_kernels.reference.paged_attention import paged_attention_reference

# The kernel tests' paged batches.
make_batch = load_repository_module("tests/kernels/attention_cases.py").make_batch

CASES = ((48, 224), (16, 1024), (16, 2048), (16, 4096), (16, 6144))
# (sequences, new tokens each, context before them)
CHUNK_CASES = ((1, 512, 0), (1, 512, 2048), (1, 512, 6144), (16, 4, 2048), (16, 9, 2048))


# Process CPU time on one thread; wall time with --threads N > 1 (CPU time would sum them).
CLOCK: Callable[[], float] = time.process_time


def _best_cpu_ms(call: Callable[[], object], repeats: int) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        start = CLOCK()
        call()
        best = min(best, CLOCK() - start)
    return best * 1e3


def measure(batch: int, context: int, repeats: int) -> dict[str, Any]:
    clean, _ = make_batch([1] * batch, [context] * batch, num_heads=9, num_kv_heads=3,
                          head_size=64, block_size=16, dtype=torch.float32, device="cpu",
                          num_blocks=2 * batch * -(-context // 16))
    if not cpu_kernel_usable(clean.query, clean.key_cache):
        raise SystemExit("the compiled CPU kernel is not available on this machine")
    out = torch.empty_like(clean.query)
    kernel = _best_cpu_ms(lambda: paged_attention_cpu(*clean.args(), 0.125, out,
                                                      sliding_window=None, softcap=None),
                          repeats)
    reference = _best_cpu_ms(lambda: paged_attention_reference(*clean.args(), 0.125), repeats)
    kv_mb = 2 * batch * context * 3 * 64 * 4 / 1e6
    return {"batch": batch, "context": context, "kv_mb": kv_mb, "kernel_ms": kernel,
            "reference_ms": reference, "kernel_gb_s": kv_mb / kernel,
            "speedup": reference / kernel}


def measure_chunks(batch: int, query_len: int, context: int, repeats: int) -> dict[str, Any]:
    clean, _ = make_batch([query_len] * batch, [context + query_len] * batch, num_heads=9,
                          num_kv_heads=3, head_size=64, block_size=16, dtype=torch.float32,
                          device="cpu",
                          num_blocks=2 * batch * -(-(context + query_len) // 16))
    out = torch.empty_like(clean.query)
    options: dict[str, Any] = {"sliding_window": None, "softcap": None}

    def tiled() -> None:
        paged_attention_tiled_cpu(*clean.args(), 0.125, out, min_query_len=1, **options)

    row: dict[str, Any] = {"batch": batch, "query_len": query_len, "context": context}
    row["reference_ms"] = _best_cpu_ms(lambda: paged_attention_reference(*clean.args(), 0.125),
                                       repeats)
    row["tiled_sgemm_ms"] = _best_cpu_ms(tiled, repeats) if set_tiled_blas(True) else None
    set_tiled_blas(False)
    row["tiled_loops_ms"] = _best_cpu_ms(tiled, repeats)
    set_tiled_blas(True)
    row["per_token_decode_kernel_ms"] = _best_cpu_ms(
        lambda: paged_attention_decode_cpu(*clean.args(), 0.125, out, max_query_len=query_len,
                                           **options), repeats)
    best_tiled = row["tiled_sgemm_ms"] or row["tiled_loops_ms"]
    row["speedup"] = row["reference_ms"] / best_tiled
    return row


def _print_chunks(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'seqs':>5}{'new':>6}{'context':>9}{'reference ms':>14}{'tiled sgemm':>13}"
          f"{'tiled loops':>13}{'per-token':>11}{'speed-up':>10}")
    for r in rows:
        sgemm = "-" if r["tiled_sgemm_ms"] is None else f"{r['tiled_sgemm_ms']:.2f}"
        print(f"{r['batch']:>5}{r['query_len']:>6}{r['context']:>9}{r['reference_ms']:>14.2f}"
              f"{sgemm:>13}{r['tiled_loops_ms']:>13.2f}"
              f"{r['per_token_decode_kernel_ms']:>11.2f}{r['speedup']:>9.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results/cpu_attention.json")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; above 1, times are wall time (an idle machine)")
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.threads == 1 else time.perf_counter
    torch.set_num_threads(args.threads)
    rows = [measure(b, c, args.repeats) for b, c in CASES]
    print(f"{'batch':>6}{'context':>9}{'KV MB':>8}{'reference ms':>14}{'kernel ms':>11}"
          f"{'kernel GB/s':>13}{'speed-up':>10}")
    for r in rows:
        print(f"{r['batch']:>6}{r['context']:>9}{r['kv_mb']:>8.1f}{r['reference_ms']:>14.2f}"
              f"{r['kernel_ms']:>11.2f}{r['kernel_gb_s']:>13.1f}{r['speedup']:>9.2f}x")
    chunks = [measure_chunks(b, q, c, args.repeats) for b, q, c in CHUNK_CASES]
    _print_chunks(chunks)
    timer = "process_time" if args.threads == 1 else "wall (perf_counter)"
    write_result(args.out, "cpu_attention", args, {
        "threads": args.threads, "timer": f"{timer}, best of repeats", "rows": rows,
        "chunk_rows": chunks})
    return 0


if __name__ == "__main__":
    sys.exit(main())
