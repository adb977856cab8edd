"""The engine's modules import each other without cycles, lazy imports included.

A cycle (the model runner and the CUDA-graph runner once imported each other, one of
them inside a function to dodge the loop) makes import order matter and hides which
module owns what. Read from the source, so imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kvrelay_worker.engine as engine_pkg

PACKAGE = "kvrelay_worker.engine"


def engine_import_graph() -> dict[str, set[str]]:
    folder = Path(engine_pkg.__file__).parent
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        tree = ast.parse((folder / f"{name}.py").read_text())
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for full in names:
                if full.startswith(PACKAGE + "."):
                    target = full[len(PACKAGE) + 1:].split(".")[0]
                    if target in modules and target != name:
                        targets.add(target)
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_graph_is_read() -> None:
    graph = engine_import_graph()
    assert "scheduler" in graph["llm_engine"]
    assert "host_batch" in graph["cuda_graphs"]


def test_no_import_cycle_in_the_engine() -> None:
    assert find_cycle(engine_import_graph()) is None


def test_a_cycle_is_found() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
