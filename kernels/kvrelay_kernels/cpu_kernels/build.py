"""Build the C++ CPU kernels once per machine, and say plainly when they cannot be built.

``torch.utils.cpp_extension.load`` compiles ``*.cpp`` from this folder into a cached build
directory (torch's own: ``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``)
keyed by a hash of the sources, the flags, the torch and Python versions and the CPU,
not by the checkout: every checkout of the same sources on a machine (a CI clone, a second
worktree) shares one build, and only the first pays the compile (100-250 s on two cores);
later starts load the cached library (concurrent first starts wait on torch's lock in that
folder). The sources register ops under ``torch.ops.kvrelay_cpu``. When no compiler works
(a slim image without gcc), ``load_cpu_kernels`` returns False once, logs why, and every
caller falls back to the PyTorch reference.

``python -m kvrelay_kernels.cpu_kernels.build`` builds ahead of time (``make install`` does,
and the worker image's build stage). A finished build leaves a stamp beside the library;
a later process that finds it loads the library directly, without torch's loader, which
would run ninja and the compiler again to find nothing to do: so a runtime image without
the toolchain (the stamped folder copied from its build stage) still gets the kernels.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import sys
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = ("paged_attention.cpp", "tiled_attention.cpp", "quantized_linear.cpp",
           "dequantized_linear.cpp", "rms_norm.cpp", "rotary.cpp", "kv_store.cpp",
           "fp8_linear.cpp", "decode_step.cpp")
# Included by the sources: part of the build folder's key, so editing one rebuilds.
HEADERS = ("quantized_args.h", "quantized_dot.h", "rms_norm.h", "rotary.h", "attend.h")
LIBRARY = "kvrelay_cpu"
# Written into the build folder once a build has finished there.
STAMP = f"{LIBRARY}.built"


def compiler_flags() -> tuple[str, ...]:
    """-O3 with OpenMP SIMD pragmas vectorises the dot products without -ffast-math (whose
    reassociation is not wanted). On Linux, -fopenmp as well: ATen's ``at::parallel_for``
    is a header template that runs serially unless the extension itself is compiled with
    OpenMP (it then joins torch's own libgomp team, sized by ``torch.set_num_threads``).
    On x86-64, -march=native adds AVX2/AVX-512 and FMA (faster than the baseline SSE2
    build); the build folder's name includes this CPU's model and flags, so a
    cache copied to another CPU is rebuilt, not misrun."""
    flags = ["-O3", "-fopenmp-simd", "-std=c++17"]
    if sys.platform == "linux":
        flags.append("-fopenmp")
        if platform.machine() in ("x86_64", "AMD64"):
            flags.append("-march=native")
    return tuple(flags)


def linker_flags() -> tuple[str, ...]:
    """-fopenmp links libgomp, which resolves to the copy torch has already loaded."""
    return ("-fopenmp",) if sys.platform == "linux" else ()


def _cpu_signature() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags", "Features")
    return "\n".join(sorted({line for line in lines if line.startswith(wanted)}))


def _source_dir() -> Path:
    return Path(__file__).resolve().parent


def default_build_dir() -> Path:
    """Where the compiled library lives: one folder per source/flag/torch combination."""
    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR", "~/.cache/torch_extensions")).expanduser()
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update((_source_dir() / name).read_bytes())
    digest.update(" ".join(compiler_flags()).encode())
    digest.update(torch.__version__.encode())
    digest.update(sys.version.encode())
    digest.update(_cpu_signature().encode())
    # Not the sources' folder: every checkout of the same sources on this machine (a CI
    # clone, a second worktree) shares one build. torch's build file names the sources by
    # absolute path, so only an unstamped folder goes through its loader (which would
    # rebuild for another checkout); a stamped one is loaded as it is.
    return cache / f"{LIBRARY}_{digest.hexdigest()[:16]}"


def build_cpu_kernels(build_dir: Path, *, verbose: bool = False) -> None:
    """Compile (or load the cached build of) the kernels into this process; raise on failure."""
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name=LIBRARY,
        sources=[str(_source_dir() / name) for name in SOURCES],
        extra_cflags=list(compiler_flags()),
        extra_ldflags=list(linker_flags()),
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=verbose,
    )
    try:
        (build_dir / STAMP).write_text(f"{LIBRARY}.so built by {' '.join(compiler_flags())}\n")
    except OSError:  # a read-only cache: the next start goes through torch's loader again
        pass


def load_prebuilt(build_dir: Path) -> bool:
    """Load the library a finished build left in ``build_dir`` (no ninja, no compiler);
    False when there is none. The folder's name already keys sources, flags, torch and CPU."""
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


if __name__ == "__main__":
    import time

    start = time.perf_counter()
    folder = default_build_dir()
    if load_prebuilt(folder):  # the same sources, flags, torch and CPU: built already
        print(f"kvrelay CPU kernels already built in {folder}")
    else:
        build_cpu_kernels(folder, verbose="-v" in sys.argv)
        print(f"kvrelay CPU kernels ready in {folder} ({time.perf_counter() - start:.1f} s)")
