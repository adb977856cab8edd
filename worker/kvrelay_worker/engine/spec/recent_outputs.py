"""The worker's memory of recent outputs, for prompt lookup across requests.

Agentic and templated workloads repeat themselves: the same tool-call skeleton, the same
boilerplate answer. When a request's own tokens hold no match for its last n tokens,
the outputs of requests that finished recently often do. Bounded by a token budget:
the oldest outputs are forgotten first, and their index entries with them.

Each output is filed under its request's cache salt (the tenant's, from the gateway):
a request is proposed only continuations of outputs with the same salt, as the prefix
cache shares blocks only within one salt. Otherwise a tenant could read another's recent
answers back one accepted draft at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq


class RecentOutputs:
    """Recent finished outputs, indexed by their n-grams (latest occurrence wins)."""

    def __init__(self, n_min: int, n_max: int, max_tokens: int = 65536) -> None:
        self.n_min = n_min
        self.n_max = n_max
        self.max_tokens = max_tokens
        self._outputs: OrderedDict[int, tuple[str | None, list[int]]] = OrderedDict()
        self._num_tokens = 0
        self._next_id = 0
        # (salt, n-gram) -> (output entry, end of the n-gram in it)
        self._index: dict[tuple[str | None, tuple[int, ...]], tuple[int, int]] = {}

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def add(self, output: Seq[int], salt: str | None = None) -> None:
        """Remember one finished output under ``salt`` (too short or too long ones are
        skipped)."""
        tokens = list(output)
        if len(tokens) <= self.n_min or len(tokens) > self.max_tokens:
            return
        entry = self._next_id
        self._next_id += 1
        self._outputs[entry] = (salt, tokens)
        self._num_tokens += len(tokens)
        for end in range(1, len(tokens)):
            for n in range(self.n_min, min(self.n_max, end) + 1):
                self._index[(salt, tuple(tokens[end - n : end]))] = (entry, end)
        while self._num_tokens > self.max_tokens:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        entry, (salt, tokens) = self._outputs.popitem(last=False)
        self._num_tokens -= len(tokens)
        for end in range(1, len(tokens)):
            for n in range(self.n_min, min(self.n_max, end) + 1):
                key = (salt, tuple(tokens[end - n : end]))
                if self._index.get(key, (None, 0))[0] == entry:
                    del self._index[key]

    def propose(self, tokens: Seq[int], k: int, salt: str | None = None) -> list[int]:
        """Up to ``k`` tokens that followed the longest match of ``tokens``' suffix in an
        output filed under ``salt``."""
        length = len(tokens)
        for n in range(min(self.n_max, length), self.n_min - 1, -1):
            hit = self._index.get((salt, tuple(tokens[length - n :])))
            if hit is not None:
                entry, start = hit
                return self._outputs[entry][1][start : start + k]
        return []
