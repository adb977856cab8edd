"""Every benchmark writes its result through the harness's one writer, in one shape.

Each script in ``benchmarks/`` is imported as Python runs it; its source must call
``write_result`` (imported from ``harness``) and write no JSON of its own; no file edits
``sys.path``; no script imports another script; every stored result carries the envelope.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.benchmark_scripts import BENCHMARKS, benchmarks_on_path, load_benchmark

# Files beside the benchmarks that are not benchmarks, and why.
NOT_BENCHMARKS = {
    "mbu_from_json": "recomputes a stored run's figures and prints them; writes nothing",
    "scaling_load": "scaling.py's load-generator child: reports to its parent on stdout",
    "decode_step": "gpu_kernels.py's decode-step measurement: a module without a main",
    "tables": "writes the docs' tables from stored results; measures nothing",
    "gpu_host_env": "gpu_check.sh's runner: a stage with only the GPU host's packages",
    "gpu_stage_result": "gpu_check.sh's judge of a stage's JUnit report; measures nothing",
}
# Files that put a folder on the import path, and why (not a shortcut around packaging).
SYS_PATH_KEPT = {
    "gpu_host_env.py": "runs a script as `python script.py` does: its folder first on the path",
}
# Imports between scripts kept on purpose: the GPU scripts change only in how they write.
SCRIPT_IMPORTS_KEPT = {("gpu_kernels", "kernels_attention")}


def scripts() -> list[str]:
    return sorted(p.stem for p in BENCHMARKS.glob("*.py"))


def benchmarks() -> list[str]:
    return [name for name in scripts() if name not in NOT_BENCHMARKS]


def _tree(name: str) -> ast.Module:
    return ast.parse((BENCHMARKS / f"{name}.py").read_text(encoding="utf-8"))


def _imported_modules(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _calls(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            found.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return found


def test_no_file_edits_sys_path() -> None:
    offenders = [str(p.relative_to(BENCHMARKS)) for p in BENCHMARKS.rglob("*.py")
                 if "sys.path.insert" in p.read_text(encoding="utf-8")
                 and str(p.relative_to(BENCHMARKS)) not in SYS_PATH_KEPT]
    assert not offenders


@pytest.mark.parametrize("name", benchmarks())
def test_benchmark_writes_through_the_harness(name: str) -> None:
    module = load_benchmark(name)  # imports as it runs: harness and its own imports resolve
    tree = _tree(name)
    harness_names = {alias.name for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module == "harness"
                     for alias in node.names}
    assert "write_result" in harness_names, f"{name} does not import harness.write_result"
    assert "write_result" in _calls(tree), f"{name} never calls write_result"
    own_writes = _calls(tree) & {"dump", "write_text", "write_bytes"}
    assert not own_writes, f"{name} writes files itself: {own_writes}"
    assert module.__name__ == f"benchmark_{name}"


@pytest.mark.parametrize("name", scripts())
def test_no_script_imports_another(name: str) -> None:
    others = {s for s in scripts() if s != name and s not in NOT_BENCHMARKS}
    imported = _imported_modules(_tree(name)) & others
    assert {(name, other) for other in imported} <= SCRIPT_IMPORTS_KEPT, imported


def test_writer_shape_and_its_refusal(tmp_path: Path) -> None:
    benchmarks_on_path()
    from harness import read_result, write_result

    out = tmp_path / "deep" / "r.json"
    write_result(out, "demo", {"rounds": 3, "folder": tmp_path}, {"tok_s": 1.5, "rows": [1]})
    record = read_result(out)
    assert list(record)[:5] == ["benchmark", "args", "commit", "machine", "date"]
    assert record["benchmark"] == "demo"
    assert record["args"] == {"rounds": 3, "folder": str(tmp_path)}
    assert len(record["commit"].removesuffix("+dirty")) == 40
    assert record["machine"]["cpu_count"] >= 1
    assert record["tok_s"] == 1.5
    with pytest.raises(ValueError, match="envelope"):
        write_result(out, "demo", {}, {"machine": "mine"})
    out.write_text(json.dumps({"tok_s": 1.0}))
    with pytest.raises(ValueError, match="not a harness result"):
        read_result(out)


def test_a_script_run_writes_the_envelope(tmp_path: Path) -> None:
    benchmarks_on_path()
    from harness import read_result

    out = tmp_path / "stop.json"
    result = subprocess.run([sys.executable, str(BENCHMARKS / "stop_matching.py"),
                             "--tokens", "40", "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    record = read_result(out)
    assert record["benchmark"] == "stop_matching"
    assert record["args"]["tokens"] == 40
    assert set(record["methods"]) == {"old scan", "regex", "aho-corasick"}


def test_every_stored_result_carries_the_envelope() -> None:
    benchmarks_on_path()
    from harness import read_result

    stored = sorted((BENCHMARKS / "measured").glob("*.json"))
    assert stored
    for path in stored:
        record = read_result(path)
        assert record["benchmark"] in set(scripts()) | {"gpu_check"}, path.name
