"""No import circle in the three packages, counting every import: at the top, inside a
function (a "lazy" import) and under ``TYPE_CHECKING``.

A circle hidden by a lazy or type-only import still ties two modules into one unit a
reader must understand together, and a later top-level import turns it into an import
error at start. The graph is read from the source (``ast``), so nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"kvrelay": ROOT / "client" / "kvrelay",
            "kvrelay_worker": ROOT / "worker" / "kvrelay_worker",
            "kvrelay_kernels": ROOT / "kernels" / "kvrelay_kernels"}


def _modules() -> dict[str, Path]:
    """Dotted module name → file, for every module of the three packages."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> Iterator[str]:
    """The modules of ``known`` that module ``name`` imports, anywhere in its body."""
    here = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` names a module; ``from mod import func`` does not.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        yield from (target for target in targets if target in known and target != name)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: set(_imported(ast.parse(path.read_text()), name,
                                path.name == "__init__.py", known))
            for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def test_the_walk_sees_lazy_and_type_only_imports() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a.b import C\n"
                     "def f():\n    from . import d\n")
    assert set(_imported(tree, "a.x", False, {"a.b", "a.d", "a.x"})) == {"a.b", "a.d"}


def test_the_graph_is_read_from_every_folder() -> None:
    graph = _graph()
    assert "kvrelay_worker.engine.runner.host_batch" in graph[
        "kvrelay_worker.engine.runner.cuda_graphs"]
    assert "kvrelay.queue_push" in graph["kvrelay.enqueue"]


def test_a_circle_is_found() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_in_the_packages() -> None:
    circles = _circles(_graph())
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)
