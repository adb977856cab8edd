"""The tiled attention's softmax exponentials, at every instruction-set level this CPU runs.

``softmax_exp.h`` has an AVX-512 path, an AVX2 path and the scalar one; the kernels build
only the machine's best level, so each level is compiled here into a small driver (the
system's C++ compiler with that level's flags) and checked against float64 ``exp`` to about one float32 ulp: rows
of every length from 0 to 40 (whole vectors and tails), masked ``-inf`` entries, the
cut-off below -87 and values at zero.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kvrelay_kernels.cpu_kernels import build
from kvrelay_kernels.cpu_kernels.cpu_isa import X86_LEVELS, best_isa, cpu_flags, is_x86, isa_flags

HEADER_DIR = Path(build.__file__).parent
COMPILER = shutil.which("c++") or shutil.which("g++")
# Levels this CPU can execute, best first (the generic build's scalar code is last).
LEVELS = list(X86_LEVELS)[list(X86_LEVELS).index(best_isa(cpu_flags())):] if is_x86() else []

pytestmark = pytest.mark.skipif(COMPILER is None or not LEVELS,
                                reason="needs a C++ compiler on x86-64")

DRIVER = r"""
#include "softmax_exp.h"
#include <cstdio>
#include <vector>
// stdin: n shift, then n values; stdout: the n exponentials and their sum
int main() {
  long n; float shift;
  while (std::scanf("%ld %a", &n, &shift) == 2) {
    std::vector<float> s(n);
    for (auto& v : s) std::scanf("%a", &v);
    const float sum = kvrelay_cpu::exp_shifted_sum(s.data(), n, shift);
    for (float v : s) std::printf("%a ", v);
    std::printf("%a\n", sum);
  }
}
"""


@pytest.fixture(scope="module", params=LEVELS)
def driver(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(f"softmax-exp-{request.param}")
    source = folder / "driver.cpp"
    source.write_text(DRIVER)
    binary = folder / "driver"
    assert COMPILER is not None
    subprocess.run([COMPILER, "-O3", "-std=c++20", *isa_flags(request.param),
                    f"-I{HEADER_DIR}", str(source), "-o", str(binary)], check=True)
    return binary


def run(driver: Path, rows: list[tuple[np.ndarray, float]]) -> list[np.ndarray]:
    lines = [f"{len(v)} {float(shift).hex()} " + " ".join(float(x).hex() for x in v)
             for v, shift in rows]
    out = subprocess.run([str(driver)], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=True).stdout.splitlines()
    return [np.array([float.fromhex(x) for x in line.split()], dtype=np.float64)
            for line in out]


def test_rows_of_every_length_match_float64_exp(driver: Path) -> None:
    rng = np.random.default_rng(0)
    rows = []
    for n in range(41):
        values = rng.normal(0, 6, n).astype(np.float32)
        values[rng.random(n) < 0.2] = -np.inf  # masked keys
        shift = float(values.max()) if n and np.isfinite(values).any() else 0.0
        rows.append((values, shift))
    for (values, shift), got in zip(rows, run(driver, rows), strict=True):
        # the shift is subtracted in float32, as the kernel does; then about 1 ulp
        expected = np.exp((values - np.float32(shift)).astype(np.float64))
        np.testing.assert_allclose(got[:-1], expected, rtol=3e-7, atol=0)
        assert got[-1] == pytest.approx(expected.sum(), rel=2e-6, abs=0)


def test_the_cut_off_and_the_ends_of_the_range(driver: Path) -> None:
    values = np.array([0.0, -1e-7, -0.5, -1.0, -20.0, -86.9, -87.0, -87.5, -100.0, -1e30,
                       -np.inf, 0.0, -3.0, -60.0, -86.0, -88.0, -0.25], dtype=np.float32)
    got = run(driver, [(values, 0.0)])[0][:-1]
    expected = np.exp(values.astype(np.float64))
    below = values < -87.0
    assert np.all(got[below] == 0.0)
    np.testing.assert_allclose(got[~below], expected[~below], rtol=3e-7, atol=0)
    assert got[0] == 1.0
    assert got[11] == 1.0
