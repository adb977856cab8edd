"""What the quality benchmarks score (``quality.py``, ``llamacpp_kquants.py``): the English
text of ``../shared/seeds`` (beside the repository), a fixed local text for perplexity,
and the prompts whose logits they compare."""

from __future__ import annotations

from pathlib import Path

# The prompts whose logits the quality benchmarks compare (eight kinds of text).
PROMPTS = [
    "The capital of France is",
    "Write a short story about a robot who learns to paint.",
    "Explain how a hash table works.",
    "def fibonacci(n):",
    "List three benefits of regular exercise:",
    "Translate to French: The weather is nice today.",
    "What is the boiling point of water at sea level?",
    "Once upon a time, in a small village by the sea,",
]


def english_text(folder: Path) -> str:
    """The lines of ``folder``'s ``*.txt`` files that are at least 95% ASCII, joined."""
    lines = []
    for path in sorted(folder.glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() and sum(c.isascii() for c in line) >= 0.95 * len(line):
                lines.append(line)
    return "\n".join(lines)
