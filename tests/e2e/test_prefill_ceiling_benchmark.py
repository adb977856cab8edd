"""``benchmarks/cpu_prefill_ceiling.py``: the peak loop builds and runs here, and a small
run accounts every second of a profiled prefill and every multiply-add of the model."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.benchmark_scripts import BENCHMARKS, benchmarks_on_path, load_benchmark

from kvrelay_kernels.cpu_kernels.cpu_isa import best_isa, cpu_flags, is_x86

pytestmark = pytest.mark.skipif(
    not is_x86() or best_isa(cpu_flags()) == "x86-64" or shutil.which("cc") is None,
    reason="the peak loop needs AVX2 or AVX-512 and a C compiler")


def test_the_peak_loop_times_each_multiply_add_the_kernels_use() -> None:
    ceiling = load_benchmark("cpu_prefill_ceiling")
    peaks = ceiling.instruction_peaks()
    wide = best_isa(cpu_flags()) == "avx512-vnni"
    expected = ({"vpdpwssd-zmm": 32, "vpdpbusd-zmm": 64, "vfmadd231ps-zmm": 16,
                 "int16-gemm-block-zmm": 32} if wide else
                {"vpmaddwd+vpaddd-ymm": 16, "vpmaddubsw+vpmaddwd+vpaddd-ymm": 32,
                 "vfmadd231ps-ymm": 8, "int16-gemm-block-ymm": 16})
    assert {name: p["macs_per_instruction"] for name, p in peaks.items()} == expected
    assert all(p["instructions_per_s"] > 1e8 for p in peaks.values())
    for kind, name in zip(("int16", "int8", "float32", "block"), expected, strict=True):
        assert ceiling.peak_of(peaks, kind) == peaks[name]["gmacs"]


def test_a_small_run_accounts_its_time_and_work(tmp_path: Path) -> None:
    benchmarks_on_path()
    from harness import read_result

    out = tmp_path / "ceiling.json"
    result = subprocess.run([sys.executable, str(BENCHMARKS / "cpu_prefill_ceiling.py"),
                             "--prompts", "2", "--tokens", "24", "--repeats", "1",
                             "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    record = read_result(out)
    families = record["families"]
    assert set(families) == {"matmul", "attention", "other ops", "outside ops"}
    assert sum(f["share"] for f in families.values()) == pytest.approx(1.0, abs=1e-6)
    # SmolLM2-135M: 30 layers of q/k/v/o (576 x 960 + 576 x 576) and gate/up/down (3 x 576 x 1536)
    per_token = 30 * (576 * 960 + 576 * 576 + 3 * 576 * 1536)
    assert families["matmul"]["gmac"] == pytest.approx(48 * per_token / 1e9)
    # Q K^T and P V: 9 heads of 64 over the 1 + ... + 24 positions of each of 2 prompts
    assert families["attention"]["gmac"] == pytest.approx(2 * 9 * 64 * 30 * 2 * 300 / 1e9)
    assert record["ceiling_tok_s"] > record["prefill"]["tok_s"] > 0
    assert record["ceiling_block_tok_s"] > record["prefill"]["tok_s"]
    assert families["matmul"]["of_block_peak"] == pytest.approx(
        families["matmul"]["gmacs"] / families["matmul"]["block_peak_gmacs"])
