"""Batched LoRA on CUDA: the Triton shrink/expand kernels against per-adapter matmuls.

Llama-3-8B-shaped layers (q|k|v 4096 -> 6144, gate|up 4096 -> 28672, down 14336 -> 4096),
bfloat16, every row of the batch on one of ``--adapters`` slots (round robin, so every
slot has rows) or none (every fourth row). Each configuration is timed with
``triton.testing.do_bench`` (median) in the same run as its baselines: the reference path
on the same CUDA tensors (one pair of matmuls per adapter, rows gathered and scattered)
and the base layer's own bfloat16 product, whose time the LoRA term adds to. Needs CUDA.

    python benchmarks/lora_gpu.py [--rows 1 64 512] [--ranks 16 64] [--adapters 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from harness import write_result

SHAPES = {"qkv": (4096, 6144), "gate_up": (4096, 28672), "down": (14336, 4096)}
OUT = Path(__file__).parent / "measured" / "gpu-lora.json"


def time_layer(rows: int, in_f: int, out_f: int, rank: int, adapters: int) -> dict[str, float]:
    """Median milliseconds of the Triton path, the reference path and the base product."""
    import triton.testing

    from kvrelay_kernels.reference.lora import lora_apply_reference
    from kvrelay_kernels.triton_kernels.lora import lora_apply_triton

    dev, dt = torch.device("cuda"), torch.bfloat16
    x = torch.randn(rows, in_f, device=dev, dtype=dt)
    w = torch.randn(out_f, in_f, device=dev, dtype=dt) / in_f**0.5
    a = torch.randn(adapters, rank, in_f, device=dev, dtype=dt) / in_f**0.5
    b = torch.randn(adapters, out_f, rank, device=dev, dtype=dt) / rank**0.5
    slots = torch.arange(rows, device=dev) % adapters
    slots[::4] = -1
    y = x @ w.T
    want = lora_apply_reference(y.clone(), x, a, b, slots)
    got = lora_apply_triton(y.clone(), x, a, b, slots)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=5e-2)
    return {
        "triton_ms": triton.testing.do_bench(lambda: lora_apply_triton(y, x, a, b, slots)),
        "reference_ms": triton.testing.do_bench(
            lambda: lora_apply_reference(y, x, a, b, slots)),
        "base_ms": triton.testing.do_bench(lambda: x @ w.T),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64, 512],
                        help="rows (tokens) of the step")
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--adapters", type=int, default=8, help="adapter slots in the batch")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("lora_gpu: needs CUDA", file=sys.stderr)
        return 2
    results = []
    for layer, (in_f, out_f) in SHAPES.items():
        for rank in args.ranks:
            for rows in args.rows:
                t = time_layer(rows, in_f, out_f, rank, args.adapters)
                row = {"layer": layer, "shape": [in_f, out_f], "rank": rank, "rows": rows,
                       **t, "speedup_vs_reference": t["reference_ms"] / t["triton_ms"],
                       "of_base": t["triton_ms"] / t["base_ms"]}
                results.append(row)
                print(f"{layer:<8} r={rank:<3} T={rows:<4} triton {t['triton_ms'] * 1e3:8.1f} us"
                      f"  reference {t['reference_ms'] * 1e3:8.1f} us"
                      f" (x{row['speedup_vs_reference']:.1f})  base {t['base_ms'] * 1e3:8.1f}"
                      f" us (LoRA adds {row['of_base']:.0%})")
    write_result(args.out, "lora_gpu", args, {"device": torch.cuda.get_device_name(),
                                              "rows": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
