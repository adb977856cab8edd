"""Prompt lookup: find the sequence's last n tokens earlier in its own tokens.

The index maps every n-gram (n in ``[n_min, n_max]``) of the tokens seen so far to the
position right after its latest occurrence, and grows by the new tokens only, so a
lookup costs the same at 100 tokens as at 8,000. Longer matches are tried first: they
predict the continuation more reliably.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq


class NgramIndex:
    """Latest continuation position of each n-gram of one growing token list."""

    def __init__(self, n_min: int, n_max: int) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_min = n_min
        self.n_max = n_max
        self._next: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in the index

    def update(self, tokens: Seq[int]) -> None:
        """Index every n-gram that ends before the last token (it has a continuation)."""
        for end in range(max(self._indexed, 1), len(tokens)):
            for n in range(self.n_min, min(self.n_max, end) + 1):
                self._next[tuple(tokens[end - n : end])] = end
        self._indexed = max(self._indexed, len(tokens))

    def propose(self, tokens: Seq[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest earlier match of the suffix."""
        self.update(tokens)
        length = len(tokens)
        for n in range(min(self.n_max, length - 1), self.n_min - 1, -1):
            start = self._next.get(tuple(tokens[length - n :]))
            if start is not None and start < length:
                return list(tokens[start : start + k])
        return []
