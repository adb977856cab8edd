"""Which quantized CPU matmul serves which row count: time per call against the rows.

For SmolLM2's gate/up projection shape (576 -> 3072), int8 (per channel) and int4
(groups of 32): the integer dot-product kernel (activations quantized to int16 per block,
``cpu_kernels/quantized_linear.cpp``), the integer GEMM (the same int16 blocks against a
repacked copy of the weights, ``cpu_kernels/int16_gemm.cpp``), the dequantized-tiles
kernel (a tile of channels dequantized into cache, then the float GEMM:
``cpu_kernels/dequantized_linear.cpp``), and the float32 ``F.linear`` baseline, for 1..256
rows. The crossing sets ``INTEGER_DOT_MAX_ROWS`` in
``kvrelay_kernels/cpu_quantized_matmul.py``. Weights rotate through more buffers than the
caches hold, as in a decode step.

    .venv/bin/python benchmarks/quant_matmul_rows.py
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from harness import environment, write_result

from kvrelay_kernels import cpu_quantized_matmul
from kvrelay_kernels.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8

OUT, IN, BUFFERS = 3072, 576, 24
GEMM_SWITCH = "KVRELAY_CPU_INT16_GEMM"
ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)
PATHS = ("integer", "gemm", "tiles")


def through(path: str, x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    """The product through one kernel, whatever ``INTEGER_DOT_MAX_ROWS`` says."""
    limit = 1 << 30 if path == "integer" else 0
    saved = cpu_quantized_matmul.INTEGER_DOT_MAX_ROWS
    cpu_quantized_matmul.INTEGER_DOT_MAX_ROWS = {8: limit, 4: limit}
    try:
        with environment({GEMM_SWITCH: "1" if path == "gemm" else "0"}):
            out = cpu_quantized_matmul.quantized_matmul_cpu(x, weight, None)
    finally:
        cpu_quantized_matmul.INTEGER_DOT_MAX_ROWS = saved
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
    columns = [f"{kind} {path}" for kind in kinds for path in PATHS]
    print(f"{'rows':>4} {'float32':>9} " + " ".join(f"{c:>13}" for c in columns) + "  (us)")
    assert cpu_quantized_matmul.load_cpu_kernels(), "the C++ kernels do not build here"
    for weights in kinds.values():  # the GEMM's packed copies made once, before timing
        for w in weights:
            cpu_quantized_matmul.int16_gemm_pack(w)
    for rows in ROWS:
        x = torch.randn(rows, IN)

        def float_call(i: int, x: torch.Tensor = x) -> object:
            return F.linear(x, floats[i % BUFFERS])

        row: dict[str, float] = {"rows": rows, "float32_us": per_call_us(float_call)}
        for kind, weights in kinds.items():
            for path in PATHS:

                def call(i: int, w: list[QuantizedWeight] = weights, x: torch.Tensor = x,
                         path: str = path) -> object:
                    return through(path, x, w[i % BUFFERS])

                row[f"{kind}_{path}_us"] = per_call_us(call)
        results.append(row)
        cells = [row[f"{c.replace(' ', '_')}_us"] for c in columns]
        print(f"{rows:>4} {row['float32_us']:>9.0f} " + " ".join(f"{c:>13.0f}" for c in cells))
    write_result(args.out, "quant_matmul_rows", args,
                 {"threads": torch.get_num_threads(), "rows": results})


if __name__ == "__main__":
    main()
