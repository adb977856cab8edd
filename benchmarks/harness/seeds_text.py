"""The English text of ``../shared/seeds`` (beside the repository): the fixed local text
the quality benchmarks score perplexity on (``quality.py``, ``llamacpp_kquants.py``)."""

from __future__ import annotations

from pathlib import Path


def english_text(folder: Path) -> str:
    """The lines of ``folder``'s ``*.txt`` files that are at least 95% ASCII, joined."""
    lines = []
    for path in sorted(folder.glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() and sum(c.isascii() for c in line) >= 0.95 * len(line):
                lines.append(line)
    return "\n".join(lines)
