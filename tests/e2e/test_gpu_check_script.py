"""``benchmarks/gpu_check.sh`` without a GPU: a clear message, status 2, nothing run.

On a GPU host the script runs the GPU suites and benchmarks (minutes); here it must stop
at its CUDA check without a traceback and without starting any stage.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs for minutes")
def test_gpu_check_stops_cleanly_without_cuda(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert "no CUDA device is visible" in result.stderr
    assert "nothing was run" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists(), "a stage started before the CUDA check"
