"""A finished build of the CPU kernels loads without the toolchain.

The worker image compiles the kernels in its build stage and copies the build folder into
a runtime stage that has no compiler and no ninja. torch's own loader runs ninja on every
first load in a process, even when nothing changed, so the runtime must load the library
the stamped build left, or it silently falls back to the PyTorch reference.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvrelay_kernels.cpu_kernels import build

# Prints whether the kernels loaded, then (if so) the ISA the quantized product runs on.
PROBE = """
import torch
from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
ok = load_cpu_kernels()
print(ok, torch.ops.kvrelay_cpu.quantized_linear_isa() if ok else "-")
"""


def _load_without_toolchain(extensions_dir: Path) -> str:
    """Run the probe in a fresh process whose PATH finds neither ninja nor a compiler."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions_dir), "PATH": "/nonexistent",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def built() -> Path:
    if not build.load_cpu_kernels():
        pytest.skip("no compiler here: the CPU kernels cannot be built")
    here = build.default_build_dir()
    assert (here / build.STAMP).is_file(), "a finished build must leave its stamp"
    return here


def test_a_stamped_build_loads_without_ninja_or_a_compiler(built: Path, tmp_path: Path) -> None:
    shutil.copytree(built, tmp_path / built.name)
    loaded, isa = _load_without_toolchain(tmp_path).split()
    assert loaded == "True"
    assert isa  # the library's own answer: it really is loaded


def test_an_unstamped_build_needs_the_toolchain(built: Path, tmp_path: Path) -> None:
    """Without the stamp (an interrupted build) torch's loader runs, and finds no ninja."""
    shutil.copytree(built, tmp_path / built.name)
    (tmp_path / built.name / build.STAMP).unlink()
    assert _load_without_toolchain(tmp_path).split()[0] == "False"
