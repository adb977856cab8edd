"""GPU kernel benchmarks: paged decode attention bandwidth and a Llama-3-8B decode step.

    python benchmarks/gpu_kernels.py [--out benchmarks/results/kernels.json] [--quick]

Refuses to run without CUDA (there is nothing to measure on a CPU). Writes every row to
JSON and prints the tables that go into benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from harness import write_result


def cuda_ready() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA device is visible (these benchmarks measure GPU kernels)"
    return True, torch.cuda.get_device_name()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/kernels.json")
    parser.add_argument("--quick", action="store_true", help="fewer points (smoke run)")
    parser.add_argument("--skip-attention", action="store_true")
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--batches", type=int, nargs="+",
                        help="attention batches (default 1 16 64 256; --quick: 1 16)")
    parser.add_argument("--contexts", type=int, nargs="+",
                        help="attention contexts (default 512 4096 32768; --quick: 512 4096)")
    parser.add_argument("--decode-batches", type=int, nargs="+",
                        help="decode-step batches (default 1 16 64; --quick: 1 16)")
    parser.add_argument("--sweep", nargs="*", metavar="PPS,SPLITS,TILE,STAGES",
                        help="also try these decode-kernel tunings (programs per SM, max "
                             "splits, tile tokens, stages) at batch 1 and 16")
    args = parser.parse_args(argv)
    ok, device = cuda_ready()
    if not ok:
        print(f"kernels benchmark: cannot run: {device}", file=sys.stderr)
        return 2

    from decode_step import format_decode_table, run_decode_step_benchmark
    from kernels_attention import (
        _override_decode_tuning,
        format_table,
        measure_copy_bandwidth,
        run_attention_benchmark,
    )

    results: dict[str, Any] = {"device": device, "started": time.time()}
    copy = measure_copy_bandwidth()
    results["copy"] = copy
    print(f"device: {device}; copy bandwidth {copy['copy_gbps']:.0f} GB/s (read+write)")
    batches = args.batches or ([1, 16] if args.quick else [1, 16, 64, 256])
    contexts = args.contexts or ([512, 4096] if args.quick else [512, 4096, 32768])
    if not args.skip_attention:
        rows = run_attention_benchmark(batches=batches, contexts=contexts)
        results["attention"] = rows
        print(format_table(rows), flush=True)
    if args.sweep and not args.skip_attention:
        from kvrelay_kernels.triton_kernels import launch_config

        defaults = (launch_config.DECODE_PROGRAMS_PER_SM, launch_config.DECODE_TILE_N,
                    launch_config.DECODE_NUM_STAGES, launch_config.DECODE_MAX_SPLITS)
        sweep = []
        for variant in args.sweep:
            pps, splits, tile, stages = (int(v) for v in variant.split(","))
            _override_decode_tuning(pps, tile, stages, splits)
            rows = run_attention_benchmark(batches=[1, 16], contexts=[4096, 32768])
            for r in rows:
                r["variant"] = variant
            sweep.extend(rows)
            print(f"variant programs/SM={pps} max splits={splits} tile={tile} stages={stages}")
            print(format_table(rows), flush=True)
        _override_decode_tuning(*defaults)
        results["attention_sweep"] = sweep
    if not args.skip_decode:
        rows = run_decode_step_benchmark(
            copy["copy_gbps"],
            batches=args.decode_batches or ([1, 16] if args.quick else [1, 16, 64]))
        results["decode_step"] = rows
        print(format_decode_table(rows), flush=True)
    write_result(args.out, "gpu_kernels", args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
