"""The CPU kernels are built per instruction-set level and loaded by the CPU's features.

One prebuilt set must serve a fleet: an AVX2 machine loads the AVX2 build, wherever it
was compiled, and never a level its CPU lacks (that would be SIGILL, not an error).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvrelay_kernels.cpu_kernels import build
from kvrelay_kernels.cpu_kernels.cpu_isa import (
    X86_LEVELS,
    UnknownIsa,
    best_isa,
    cpu_flags,
    is_x86,
    selected_isa,
)

pytestmark = pytest.mark.skipif(not is_x86(), reason="the levels are x86-64's")

# The flags lines of /proc/cpuinfo on three kinds of machine (trimmed to what matters).
ZEN3_AVX2 = ("flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c "
             "rdrand abm bmi1 avx2 bmi2 fma adx sha_ni")
SAPPHIRE_RAPIDS = (ZEN3_AVX2 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni "
                   "avx512_bf16 amx_tile amx_int8")
SKYLAKE_X = ZEN3_AVX2 + " avx512f avx512dq avx512cd avx512bw avx512vl"  # no VNNI
OLD_ATOM = "flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 movbe popcnt"


def test_each_cpu_gets_the_best_level_it_has() -> None:
    assert best_isa(cpu_flags(ZEN3_AVX2)) == "avx2"
    assert best_isa(cpu_flags(SAPPHIRE_RAPIDS)) == "avx512-vnni"
    assert best_isa(cpu_flags(SKYLAKE_X)) == "avx2"  # the 512-bit path wants VNNI
    assert best_isa(cpu_flags(OLD_ATOM)) == "x86-64"
    assert best_isa(cpu_flags("")) == "x86-64"


def test_a_lower_level_can_be_asked_for_and_a_higher_one_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVRELAY_CPU_ISA", "avx2")
    assert selected_isa(cpu_flags(SAPPHIRE_RAPIDS)) == "avx2"
    monkeypatch.setenv("KVRELAY_CPU_ISA", "avx512-vnni")
    with pytest.raises(UnknownIsa, match="best level is 'avx2'"):
        selected_isa(cpu_flags(ZEN3_AVX2))
    monkeypatch.setenv("KVRELAY_CPU_ISA", "sse9")
    with pytest.raises(UnknownIsa, match="not one of"):
        selected_isa(cpu_flags(ZEN3_AVX2))


def test_levels_build_in_folders_of_their_own_keyed_by_flags_not_by_cpu() -> None:
    folders = {isa: build.default_build_dir(isa) for isa in X86_LEVELS}
    assert len(set(folders.values())) == len(X86_LEVELS)
    assert all(isa in folder.name for isa, folder in folders.items())
    assert "-march=x86-64-v3" in build.compiler_flags("avx2")
    assert not any("native" in flag for isa in X86_LEVELS for flag in build.compiler_flags(isa))


PROBE = """
import torch
from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
ok = load_cpu_kernels()
print(ok, torch.ops.kvrelay_cpu.quantized_linear_isa() if ok else "-")
"""


def test_an_avx2_build_made_elsewhere_loads_on_an_avx2_cpu(tmp_path: Path) -> None:
    """The AVX2 folder, copied to a machine with no toolchain (the image's runtime), is
    what the dispatch loads there, and its kernels are the AVX2 ones. This machine plays
    the AVX2 one: as it is where its best level is AVX2, told so where it has more."""
    if best_isa(cpu_flags()) == "x86-64":
        pytest.skip("this CPU has no AVX2")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if best_isa(cpu_flags()) != "avx2":
        env["KVRELAY_CPU_ISA"] = "avx2"
    # built here, as a build stage would (a separate process: one level per process)
    subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                   timeout=900, check=True)
    folder = build.default_build_dir("avx2")
    assert (folder / build.STAMP).is_file()
    elsewhere = tmp_path / "extensions"
    shutil.copytree(folder, elsewhere / folder.name)
    env.update(TORCH_EXTENSIONS_DIR=str(elsewhere), PATH="/nonexistent")  # no ninja, no gcc
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    assert done.stdout.split() == ["True", "avx2"]
