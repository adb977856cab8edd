"""Build the C++ CPU kernels once per instruction-set level, and say plainly when they cannot be.

``torch.utils.cpp_extension.load`` compiles ``*.cpp`` from this folder into a cached build
directory (torch's own: ``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``)
keyed by a hash of the sources, the flags (the instruction-set level's among them), the
torch and Python versions, not by the checkout or the CPU model: every checkout of the
same sources on a machine (a CI clone, a second worktree) shares one build, a folder built
on another machine of the same level loads as it is, and only the first pays the compile
(100-250 s on two cores); later starts load the cached library (concurrent first starts
wait on torch's lock in that folder). Which level a process loads is the CPU's best
(``cpu_isa.py``), so one prebuilt set serves a fleet of mixed CPUs. The sources register
ops under ``torch.ops.kvrelay_cpu``. When no compiler works (a slim image without gcc),
``load_cpu_kernels`` returns False once, logs why, and every caller falls back to the
PyTorch reference.

``python -m kvrelay_kernels.cpu_kernels.build`` builds this CPU's level ahead of time
(``make install`` does); ``--all`` builds every level (the worker image's build stage). A
finished build leaves a stamp beside the library; a later process that finds it loads the
library directly, without torch's loader, which would run ninja and the compiler again to
find nothing to do: so a runtime image without the toolchain (the stamped folders copied
from its build stage) still gets the kernels.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
from pathlib import Path

import torch

from kvrelay_kernels.cpu_kernels.cpu_isa import X86_LEVELS, is_x86, isa_flags, selected_isa

log = logging.getLogger(__name__)

SOURCES = ("paged_attention.cpp", "tiled_attention.cpp", "quantized_linear.cpp",
           "dequantized_linear.cpp", "rms_norm.cpp", "rotary.cpp", "kv_store.cpp",
           "fp8_linear.cpp", "decode_step.cpp", "int16_gemm.cpp")
# Included by the sources: part of the build folder's key, so editing one rebuilds.
HEADERS = ("quantized_args.h", "int16_dot_isa.h", "quantized_dot.h", "rms_norm.h", "rotary.h",
           "attend.h", "decode_step_parts.h", "softmax_exp.h", "float_vec.h")
LIBRARY = "kvrelay_cpu"
# Written into the build folder once a build has finished there.
STAMP = f"{LIBRARY}.built"


def compiler_flags(isa: str) -> tuple[str, ...]:
    """-O3 with OpenMP SIMD pragmas vectorises the dot products without -ffast-math (whose
    reassociation is not wanted). On Linux, -fopenmp as well: ATen's ``at::parallel_for``
    is a header template that runs serially unless the extension itself is compiled with
    OpenMP (it then joins torch's own libgomp team, sized by ``torch.set_num_threads``).
    Then the instruction-set level's flags (``cpu_isa.py``): on x86-64, AVX2/AVX-512 and
    FMA make the kernels several times faster than the baseline SSE2 build."""
    flags = ["-O3", "-fopenmp-simd", "-std=c++17"]
    if sys.platform == "linux":
        flags.append("-fopenmp")
    return (*flags, *isa_flags(isa))


def linker_flags() -> tuple[str, ...]:
    """-fopenmp links libgomp, which resolves to the copy torch has already loaded."""
    return ("-fopenmp",) if sys.platform == "linux" else ()


def _source_dir() -> Path:
    return Path(__file__).resolve().parent


def default_build_dir(isa: str | None = None) -> Path:
    """Where the compiled library of level ``isa`` (default: this process's) lives: one
    folder per source/flag/torch/Python combination."""
    isa = selected_isa() if isa is None else isa
    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR", "~/.cache/torch_extensions")).expanduser()
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update((_source_dir() / name).read_bytes())
    digest.update(" ".join(compiler_flags(isa)).encode())
    digest.update(torch.__version__.encode())
    digest.update(sys.version.encode())
    # Not the sources' folder: every checkout of the same sources on this machine (a CI
    # clone, a second worktree) shares one build. torch's build file names the sources by
    # absolute path, so only an unstamped folder goes through its loader (which would
    # rebuild for another checkout); a stamped one is loaded as it is.
    return cache / f"{LIBRARY}_{isa}_{digest.hexdigest()[:16]}"


def build_cpu_kernels(build_dir: Path, isa: str | None = None, *, verbose: bool = False,
                      load: bool = True) -> None:
    """Compile (or load the cached build of) the kernels of level ``isa`` (default: this
    process's) into ``build_dir``, and into this process unless ``load`` is False (a level
    this CPU cannot run); raise on failure."""
    from torch.utils import cpp_extension

    isa = selected_isa() if isa is None else isa
    build_dir.mkdir(parents=True, exist_ok=True)
    flags = compiler_flags(isa)
    sources = [str(_source_dir() / name) for name in SOURCES]
    cflags, ldflags = list(flags), list(linker_flags())
    if load:
        cpp_extension.load(name=LIBRARY, sources=sources, extra_cflags=cflags,
                           extra_ldflags=ldflags, build_directory=str(build_dir),
                           verbose=verbose, is_python_module=False)
    else:  # compile and link only: a level above this CPU's must not be loaded here
        cpp_extension._write_ninja_file_and_build_library(
            name=LIBRARY, sources=sources, extra_cflags=cflags, extra_ldflags=ldflags,
            build_directory=str(build_dir), verbose=verbose, extra_cuda_cflags=None,
            extra_sycl_cflags=None, extra_include_paths=None, with_cuda=False,
            with_sycl=False)
    try:
        (build_dir / STAMP).write_text(f"{LIBRARY}.so built by {' '.join(flags)}\n")
    except OSError:  # a read-only cache: the next start goes through torch's loader again
        pass


def load_prebuilt(build_dir: Path) -> bool:
    """Load the library a finished build left in ``build_dir`` (no ninja, no compiler);
    False when there is none. The folder's name already keys sources, flags (the level's),
    torch and Python."""
    library = build_dir / f"{LIBRARY}.so"
    if not ((build_dir / STAMP).is_file() and library.is_file()):
        return False
    torch.ops.load_library(str(library))
    return True


@functools.cache
def load_cpu_kernels() -> bool:
    """True once ``torch.ops.kvrelay_cpu`` is usable; False (logged once) when it cannot be."""
    if hasattr(torch.ops, LIBRARY) and hasattr(getattr(torch.ops, LIBRARY), "paged_attention"):
        return True
    try:
        build_dir = default_build_dir()
        if not load_prebuilt(build_dir):
            build_cpu_kernels(build_dir)
    except Exception as exc:  # no compiler, no ninja, a broken toolchain: use the reference
        log.warning("CPU kernels unavailable, using the PyTorch reference: %s: %s",
                    type(exc).__name__, str(exc).strip().splitlines()[-1:] or "")
        return False
    return True


def build_every_level(*, verbose: bool = False) -> None:
    """Build each instruction-set level (the worker image's build stage): the levels this
    CPU runs are loaded once to check them, the others only compiled and linked."""
    import time

    levels = list(X86_LEVELS) if is_x86() else [selected_isa()]
    for isa in levels:
        start = time.perf_counter()
        folder = default_build_dir(isa)
        if (folder / STAMP).is_file():
            print(f"kvrelay CPU kernels ({isa}) already built in {folder}")
            continue
        # One library per process: this CPU's own level is loaded (a check that it
        # runs), the others only built.
        build_cpu_kernels(folder, isa, verbose=verbose, load=isa == selected_isa())
        print(f"kvrelay CPU kernels ({isa}) ready in {folder} "
              f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    import time

    if "--all" in sys.argv:
        build_every_level(verbose="-v" in sys.argv)
        sys.exit(0)
    start = time.perf_counter()
    folder = default_build_dir()
    if load_prebuilt(folder):  # the same sources, flags, torch and level: built already
        print(f"kvrelay CPU kernels ({selected_isa()}) already built in {folder}")
    else:
        build_cpu_kernels(folder, verbose="-v" in sys.argv)
        print(f"kvrelay CPU kernels ({selected_isa()}) ready in {folder} "
              f"({time.perf_counter() - start:.1f} s)")
