"""W8A16 / W4A16 Triton GEMM at batch 1 on a GPU, as a share of copy bandwidth.

Llama-3-8B-shaped layers (4096 -> 14336 gate/up half, 14336 -> 4096 down), bfloat16
activations, int8 per channel and int4 groups of 32. Bytes = packed weights + scales (+
minimums), read once; copy bandwidth = a device-to-device copy of a 1 GiB tensor (bytes
read + written). Issue 17's target: >= 70% at batch 1. Not run yet (no GPU was lent to
the session that wrote it); runs as is on a CUDA machine:

    .venv/bin/python benchmarks/quant_gpu.py [--out FILE] [--rows 1 16]

Each row also times the same product with bfloat16 weights (``F.linear``), the
speed-up the quantized weights must earn.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from harness import write_result

from kvrelay_kernels.quantized_matmul import quantized_matmul
from kvrelay_kernels.quantized_weight import quantize_int4, quantize_int8

SHAPES = ((14336, 4096), (4096, 14336))
OUT = Path(__file__).parent / "measured" / "gpu-quant-gemm.json"


def cuda_ms(fn: object, iters: int = 200) -> float:
    assert callable(fn)
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16],
                        help="activation rows M (decode batch sizes)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("quant_gpu: needs CUDA", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_gbs = 2 * src.numel() / cuda_ms(lambda: dst.copy_(src)) / 1e6
    rows = []
    for n, k in SHAPES:
        w = torch.randn(n, k, device=device) * 0.02
        bf16 = w.to(torch.bfloat16)
        for m in args.rows:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            base_ms = cuda_ms(lambda x=x, bf16=bf16: torch.nn.functional.linear(x, bf16))
            for name, qw in (("int8", quantize_int8(w)), ("int4-g32", quantize_int4(w, 32))):
                ms = cuda_ms(lambda qw=qw, x=x: quantized_matmul(x, qw))
                gbs = qw.nbytes / ms / 1e6
                rows.append({"shape": [n, k], "m": m, "weights": name, "ms": ms, "gb_s": gbs,
                             "of_copy": gbs / copy_gbs, "bf16_ms": base_ms,
                             "speedup_vs_bf16": base_ms / ms})
                print(f"{n}x{k} M={m:<3} {name:<9} {ms * 1e3:8.1f} us {gbs:8.1f} GB/s "
                      f"{gbs / copy_gbs:6.1%} of copy ({copy_gbs:.0f} GB/s); bf16 "
                      f"{base_ms * 1e3:8.1f} us, x{base_ms / ms:.2f}")
    write_result(args.out, "quant_gpu", args, {"device": torch.cuda.get_device_name(),
                                               "copy_gb_s": copy_gbs, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
