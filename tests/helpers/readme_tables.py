"""Markdown tables of README.md and the docs/ pages, found by their header row, as lists
of cell lists; and the pages themselves, so drift tests read where a table now lives."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
DOCS = README.parent / "docs"


def doc_text(name: str) -> str:
    """The text of ``docs/NAME`` (``cli.md``, ``configuration.md``, ...)."""
    return (DOCS / name).read_text(encoding="utf-8")


def usage_pages() -> list[Path]:
    """README.md and every docs/ page: where usage examples live."""
    return [README, *sorted(DOCS.glob("*.md"))]

_CODE = re.compile(r"`([^`]+)`")


def readme_table(header: str, text: str | None = None) -> list[list[str]]:
    """The body rows of the table whose header row starts with ``header``."""
    source = README.read_text(encoding="utf-8") if text is None else text
    lines = source.splitlines()
    for index, line in enumerate(lines):
        if line.startswith(header):
            rows = []
            for row in lines[index + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(_cells(row))
            return rows
    raise AssertionError(f"no table starting {header!r}")


def _cells(row: str) -> list[str]:
    # Split on pipes that are not escaped (``NAME\\|PATH`` stays one cell).
    parts = re.split(r"(?<!\\)\|", row.strip().strip("|"))
    return [part.strip() for part in parts]


def code_spans(cell: str) -> list[str]:
    """The text of every `code span` in ``cell``."""
    return _CODE.findall(cell)
