"""A machine without a C++ compiler: the CPU kernels fail to build, say so once, and paged
attention and quantized matmuls run the PyTorch references with the same results.

Runs in a fresh interpreter (the compiled library, once loaded, stays loaded) with ``CXX``
pointing at no compiler and an empty extensions folder, so nothing cached can stand in.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
import torch
sys.path.insert(0, {cases!r})
from attention_cases import dense_attention, make_batch
import kvrelay_kernels
from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels

clean, _ = make_batch([1, 5, 1], [9, 20, 33], num_heads=6, num_kv_heads=2, head_size=64,
                      block_size=16, dtype=torch.float32, device="cpu")
got = kvrelay_kernels.paged_attention(*clean.args(), 0.3)
torch.testing.assert_close(got.double(), dense_attention(clean, 0.3), atol=2e-5, rtol=1e-5)
from kvrelay_kernels.cpu_quantized_matmul import cpu_kernel_names
from kvrelay_kernels.quantized_matmul import quantized_matmul
from kvrelay_kernels.quantized_weight import quantize_int4
from kvrelay_kernels.reference.quantized_matmul import dequantize_weight
weight = quantize_int4(torch.randn(64, 128), 32)
for rows in (1, 9):
    x = torch.randn(rows, 128)
    torch.testing.assert_close(quantized_matmul(x, weight),
                               x @ dequantize_weight(weight).T, atol=1e-4, rtol=1e-5)
print("quantized:", cpu_kernel_names())
print("kernels loaded:", load_cpu_kernels())
"""


def test_missing_compiler_falls_back_to_the_reference(tmp_path: Path) -> None:
    env = {"CXX": str(tmp_path / "no-such-c++"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    script = SCRIPT.format(cases=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "kernels loaded: False" in done.stdout
    assert "quantized: reference (no C++ extension)" in done.stdout
    assert "CPU kernels unavailable, using the PyTorch reference" in done.stderr
