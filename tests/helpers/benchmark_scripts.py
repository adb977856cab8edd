"""Load a ``benchmarks/`` script as a module, as Python runs it: its folder on the path,
so its ``import harness`` finds the shared harness."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def benchmarks_on_path() -> None:
    """Put ``benchmarks/`` on ``sys.path`` (once) so ``harness`` imports."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` imported under ``benchmark_NAME`` (its ``main`` not run)."""
    benchmarks_on_path()
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
