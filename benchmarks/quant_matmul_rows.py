"""Where the fused quantized CPU matmul stops paying: time per call against the row count.

For SmolLM2's gate/up projection shape (576 -> 3072), int8 (per channel) and int4
(groups of 32): the compiled dequantize-multiply-reduce loop, dequantize (compiled) then ``F.linear``,
and the float32 ``F.linear`` baseline, for 1..32 rows. The crossing sets
``DEQUANTIZE_ABOVE_ROWS`` in ``kvrelay_kernels/cpu_quantized_matmul.py``. Weights rotate
through more buffers than the caches hold, as in a decode step.

    .venv/bin/python benchmarks/quant_matmul_rows.py
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from harness import write_result

from kvrelay_kernels import cpu_quantized_matmul
from kvrelay_kernels.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8

OUT, IN, BUFFERS = 3072, 576, 24
ROWS = (1, 2, 4, 8, 16, 32)


def dequantize_then_linear(x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    saved = cpu_quantized_matmul.DEQUANTIZE_ABOVE_ROWS
    cpu_quantized_matmul.DEQUANTIZE_ABOVE_ROWS = 0
    try:
        out = cpu_quantized_matmul.quantized_matmul_cpu(x, weight, None)
    finally:
        cpu_quantized_matmul.DEQUANTIZE_ABOVE_ROWS = saved
    assert out is not None
    return out


def per_call_us(fn: Callable[[int], object], calls: int = 60) -> float:
    for i in range(3):
        fn(i)
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "measured" / "cpu-quant-matmul-rows.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    floats = [torch.randn(OUT, IN) * 0.02 for _ in range(BUFFERS)]
    kinds: dict[str, list[QuantizedWeight]] = {
        "int8": [quantize_int8(w) for w in floats],
        "int4": [quantize_int4(w, 32) for w in floats],
    }
    results = []
    print(f"{'rows':>4} {'float32 us':>11} " + " ".join(
        f"{k + ' fused':>11} {k + ' deq+mm':>11}" for k in kinds))
    cpu_quantized_matmul.DEQUANTIZE_ABOVE_ROWS = 1 << 30  # always the fused loop here
    for rows in ROWS:
        x = torch.randn(rows, IN)
        row = {"rows": rows,
               "float32_us": per_call_us(lambda i, x=x: F.linear(x, floats[i % BUFFERS]))}
        for kind, weights in kinds.items():
            row[f"{kind}_fused_us"] = per_call_us(
                lambda i, w=weights, x=x: cpu_quantized_matmul.quantized_matmul_cpu(
                    x, w[i % BUFFERS], None))
            row[f"{kind}_dequant_us"] = per_call_us(  # compiled dequantize + F.linear
                lambda i, w=weights, x=x: dequantize_then_linear(x, w[i % BUFFERS]))
        results.append(row)
        print(f"{rows:>4} {row['float32_us']:>11.0f} " + " ".join(
            f"{row[k + '_fused_us']:>11.0f} {row[k + '_dequant_us']:>11.0f}" for k in kinds))
    write_result(args.out, "quant_matmul_rows", args,
                 {"threads": torch.get_num_threads(), "rows": results})


if __name__ == "__main__":
    main()
