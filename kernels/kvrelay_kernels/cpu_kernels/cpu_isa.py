"""Which instruction-set level the CPU kernels are built for, chosen by the CPU at run time.

``-march=native`` builds for the build machine only: a library compiled on an AVX-512
machine dies with SIGILL on an AVX2 one, so nothing could be prebuilt for a fleet. The
kernels are instead built once per level (the level's compiler flags are part of the
build folder's key, the CPU model is not), and each process loads the best level its CPU
has, read from the CPU's feature flags. A folder built anywhere (an image's build stage,
another machine) serves every CPU of its level.

``KVRELAY_CPU_ISA`` picks a lower level than the CPU's best (to compare them, or to use a
prebuilt folder of that level); a level the CPU lacks is refused.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

# Best first: the level's compiler flags and the /proc/cpuinfo flags it needs. x86-64-v3
# is Haswell's and Zen's set (AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE); x86-64-v4 adds
# AVX-512 F/BW/CD/DQ/VL, and the kernels' 512-bit path also wants VNNI.
X86_LEVELS: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "avx512-vnni": (("-march=x86-64-v4", "-mavx512vnni"),
                    frozenset({"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm",
                               "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl",
                               "avx512_vnni"})),
    "avx2": (("-march=x86-64-v3",),
             frozenset({"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm"})),
    "x86-64": (("-march=x86-64",), frozenset()),
}
# Elsewhere (arm64, ...): one level, the compiler's default for the platform.
GENERIC = "generic"


class UnknownIsa(ValueError):
    """``KVRELAY_CPU_ISA`` names a level that does not exist or that this CPU lacks."""


def is_x86() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The feature flags of the first CPU in ``/proc/cpuinfo`` (empty where unreadable)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def best_isa(flags: frozenset[str]) -> str:
    """The best x86 level whose flags are all in ``flags``."""
    return next(level for level, (_, needs) in X86_LEVELS.items() if needs <= flags)


def selected_isa(flags: frozenset[str] | None = None) -> str:
    """The level this process loads: the CPU's best, or a lower one ``KVRELAY_CPU_ISA``
    names."""
    if not is_x86():
        return GENERIC
    best = best_isa(cpu_flags() if flags is None else flags)
    forced = os.environ.get("KVRELAY_CPU_ISA", "").strip().lower()
    if not forced:
        return best
    levels = list(X86_LEVELS)
    if forced not in X86_LEVELS:
        raise UnknownIsa(f"KVRELAY_CPU_ISA={forced!r}: not one of {', '.join(levels)}")
    if levels.index(forced) < levels.index(best):
        raise UnknownIsa(f"KVRELAY_CPU_ISA={forced!r}: this CPU's best level is {best!r}")
    return forced


def isa_flags(isa: str) -> tuple[str, ...]:
    """The compiler flags of level ``isa``."""
    return () if isa == GENERIC else X86_LEVELS[isa][0]
