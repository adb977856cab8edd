"""Stop strings as one Aho-Corasick automaton, so each step costs O(new text).

Scanning the whole text (or a window of it) once per stop string made every token cost
stop count x stop length, for every request in the batch. The automaton reads each new
character once, whatever the number of stop strings, and its state answers both
questions the detokenizer asks: did a stop string just end, and how long is the tail of
the text that could still begin one (the text held back from the stream).

Built once per distinct set of stop strings (a request's choices share it) and immutable:
the per-choice state is a plain int the caller keeps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

ROOT = 0


@dataclass(frozen=True, slots=True)
class ScanResult:
    """Where the automaton is after some text, and the earliest stop string found in it."""

    state: int
    # Start of the earliest-starting stop string that ended inside the scanned text,
    # relative to that text's start (negative: it began in text scanned before); or None.
    match_start: int | None


class StopMatcher:
    """Aho-Corasick over a fixed set of stop strings (characters, not bytes)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.max_len = max((len(s) for s in stops), default=0)
        self._goto: list[dict[str, int]] = [{}]
        self._depth: list[int] = [0]
        for stop in stops:
            self._insert(stop)
        self._fail: list[int] = [ROOT] * len(self._goto)
        # Length of the longest stop string that ends at this state (0: none does).
        self._longest: list[int] = [0] * len(self._goto)
        for stop in stops:
            end = self._walk_exact(stop)
            self._longest[end] = max(self._longest[end], len(stop))
        self._link()

    def _insert(self, stop: str) -> None:
        state = ROOT
        for ch in stop:
            nxt = self._goto[state].get(ch)
            if nxt is None:
                nxt = len(self._goto)
                self._goto.append({})
                self._depth.append(self._depth[state] + 1)
                self._goto[state][ch] = nxt
            state = nxt

    def _walk_exact(self, stop: str) -> int:
        state = ROOT
        for ch in stop:
            state = self._goto[state][ch]
        return state

    def _link(self) -> None:
        """Failure links breadth first; a state inherits the longest match of its link."""
        queue: deque[int] = deque(self._goto[ROOT].values())
        while queue:
            state = queue.popleft()
            for ch, child in self._goto[state].items():
                queue.append(child)
                fallback = self._fail[state]
                while fallback != ROOT and ch not in self._goto[fallback]:
                    fallback = self._fail[fallback]
                self._fail[child] = self._goto[fallback].get(ch, ROOT)
                self._longest[child] = max(self._longest[child], self._longest[self._fail[child]])

    def scan(self, state: int, text: str) -> ScanResult:
        """Feed ``text`` from ``state``; report the earliest-starting stop string that ends
        inside it."""
        goto, fail, longest = self._goto, self._fail, self._longest
        match_start: int | None = None
        for i, ch in enumerate(text):
            while state != ROOT and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, ROOT)
            found = longest[state]
            if found:
                start = i + 1 - found
                if match_start is None or start < match_start:
                    match_start = start
        return ScanResult(state, match_start)

    def pending(self, state: int) -> int:
        """Length of the longest tail of the text read so far that could still begin a stop
        string and is shorter than the longest one (a whole one would have matched)."""
        while self._depth[state] >= self.max_len and state != ROOT:
            state = self._fail[state]
        return self._depth[state]


@lru_cache(maxsize=16)
def stop_matcher(stops: tuple[str, ...]) -> StopMatcher:
    """The automaton for ``stops``, built once and shared by every choice that uses them.

    Building is cheap (under a millisecond for 16 strings of 256 characters) but an
    automaton of that size holds thousands of small dicts, so only a few recent ones stay.
    """
    return StopMatcher(stops)
