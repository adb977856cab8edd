"""Model loading is one door: the CLI and the engine use ``kvrelay_worker.loading`` only.

The decoder (``kvrelay_worker.models``) never imports loading; code outside the loading
package imports its entry module, not its files; and the entry module stays cheap, so
``kvrelay models`` lists models without importing torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import kvrelay
import kvrelay_worker
import kvrelay_worker.loading as loading

WORKER = Path(kvrelay_worker.__file__).parent
CLIENT = Path(kvrelay.__file__).parent


def imported_modules(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
    return names


def test_users_outside_loading_import_only_its_entry_module() -> None:
    users = [*CLIENT.rglob("*.py"), *(WORKER / "engine").rglob("*.py")]
    reaching_in = {
        str(path): name
        for path in users
        for name in imported_modules(path)
        if name.startswith("kvrelay_worker.loading.")
    }
    assert reaching_in == {}
    engine_imports = imported_modules(WORKER / "engine" / "llm_engine.py")
    assert "kvrelay_worker.loading" in engine_imports


def test_the_decoder_does_not_import_loading() -> None:
    for path in (WORKER / "models").glob("*.py"):
        assert not [n for n in imported_modules(path) if n.startswith("kvrelay_worker.loading")]


def test_every_exported_name_resolves() -> None:
    for name in loading.__all__:
        assert getattr(loading, name) is not None, name


def test_listing_models_does_not_import_torch() -> None:
    code = ("import sys; from kvrelay_worker.loading import known_models, DEFAULT_MODEL; "
            "known_models(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "False"
