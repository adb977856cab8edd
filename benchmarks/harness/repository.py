"""Modules of the repository that are not on the path of a benchmark script (the tests'
model builders and kernel cases), loaded by file so no script edits ``sys.path``."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from harness.machine import REPOSITORY


def load_repository_module(relative: str) -> ModuleType:
    """The module at ``REPOSITORY / relative``, imported once under its file's stem."""
    name = f"_repository_{relative.removesuffix('.py').replace('/', '_')}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPOSITORY / relative)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
