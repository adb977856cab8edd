"""The docs quote each measured figure once and the same everywhere, as its result says.

A page quotes a figure as ``<!-- figure: NAME -->VALUE``; a generated table sits between
``<!-- table: NAME -->`` and ``<!-- /table -->`` (``benchmarks/harness/tables.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.benchmark_scripts import benchmarks_on_path
from helpers.readme_tables import README

benchmarks_on_path()
from harness import tables  # noqa: E402  (benchmarks/ is put on the path just above)


def test_readme_is_usage_sized() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 400


def test_readme_performance_table_is_generated_and_short() -> None:
    text = README.read_text(encoding="utf-8")
    (match,) = tables.TABLE.finditer(text)
    assert match["name"] == "performance"
    rows = [line for line in match["body"].splitlines() if line.startswith("| ")][1:]
    assert 1 <= len(rows) <= 8


def test_tables_and_figures_match_their_result_files() -> None:
    assert tables.stale() == [], "run: python benchmarks/tables.py"


def test_a_figure_quoted_on_two_pages_is_the_same() -> None:
    differing = {name: values for name, values in tables.quoted_figures(tables.pages()).items()
                 if len(values) > 1}
    assert not differing


def test_every_quoted_figure_is_known() -> None:
    quoted = set(tables.quoted_figures(tables.pages()))
    assert quoted <= set(tables.FIGURES), quoted - set(tables.FIGURES)


def test_a_page_that_disagrees_is_caught(tmp_path: Path) -> None:
    """A figure edited by hand on one page, and a table edited by hand, are both found."""
    for name in ("README.md", "docs/scaling.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((tables.REPOSITORY / name).read_text(encoding="utf-8"))
    scaling = tmp_path / "docs/scaling.md"
    right = tables.FIGURES["gpus-per-redis"].value()
    text = scaling.read_text(encoding="utf-8")
    assert f"<!-- figure: gpus-per-redis -->{right}" in text
    scaling.write_text(text.replace(f"<!-- figure: gpus-per-redis -->{right}",
                                    "<!-- figure: gpus-per-redis -->11"))
    assert tables.stale(tmp_path) == ["docs/scaling.md"]
    quoted = tables.quoted_figures(tables.pages(tmp_path))["gpus-per-redis"]
    assert set(quoted) == {right, "11"}
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8").replace(
        tables.FIGURES["serve-ratio"].value(), "0.90×", 1))
    assert tables.stale(tmp_path) == ["README.md", "docs/scaling.md"]


def test_a_new_result_changes_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table follows the file: a different result gives a different table."""
    measured = tmp_path / "measured"
    measured.mkdir()
    for path in tables.MEASURED.glob("*.json"):
        (measured / path.name).write_text(path.read_text(encoding="utf-8"))
    before = tables.performance_table()
    record = json.loads((measured / "cpu-serve.json").read_text(encoding="utf-8"))
    record["throughput_ratio"] = 0.5
    (measured / "cpu-serve.json").write_text(json.dumps(record))
    monkeypatch.setattr(tables, "MEASURED", measured)
    after = tables.performance_table()
    assert before != after
    assert "<!-- figure: serve-ratio -->0.50×" in after
