"""Stop-string matching: the same answers as a plain search, for O(new text) work per step.

The reference is brute force over the whole text. The work test counts the Python lines
run per token (``sys.settrace``, deterministic, not a timing): with 64 stop strings of
256 characters it must stay within twice that of one short stop string; the old scan of
every stop string over a window per token ran hundreds of times more.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvrelay_worker.engine.sample.detokenizer import IncrementalDetokenizer
from kvrelay_worker.engine.sample.stop_matcher import ROOT, StopMatcher

LETTERS = "abé日"


def earliest_stop(text: str, stops: list[str], ended_after: int) -> int | None:
    """Brute force: earliest start of a stop string ending after ``ended_after``."""
    starts = [i for s in stops for i in range(len(text) - len(s) + 1)
              if text.startswith(s, i) and i + len(s) > ended_after]
    return min(starts) if starts else None


def pending_tail(text: str, stops: list[str]) -> int:
    """Brute force: longest tail (shorter than the longest stop) that begins a stop."""
    longest = max(len(s) for s in stops)
    for length in range(min(longest - 1, len(text)), 0, -1):
        if any(s.startswith(text[-length:]) for s in stops):
            return length
    return 0


@settings(max_examples=300, deadline=None)
@given(stops=st.lists(st.text(LETTERS, min_size=1, max_size=6), min_size=1, max_size=6),
       chunks=st.lists(st.text(LETTERS, max_size=5), max_size=12))
def test_scan_agrees_with_brute_force(stops: list[str], chunks: list[str]) -> None:
    matcher = StopMatcher(stops)
    state, text = ROOT, ""
    for chunk in chunks:
        result = matcher.scan(state, chunk)
        expected = earliest_stop(text + chunk, stops, len(text))
        got = None if result.match_start is None else len(text) + result.match_start
        assert got == expected, (stops, text, chunk)
        state, text = result.state, text + chunk
        assert matcher.pending(state) == pending_tail(text, stops), (stops, text)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_folder)


def traced_lines(run: Callable[[], None]) -> int:
    """Python lines executed by ``run`` (every frame, generator expressions included)."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return count


def lines_per_token(tokenizer: Any, stops: list[str], ids: list[int]) -> float:
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Prompt:"), stops)

    def stream() -> None:
        for token in ids:
            assert not detok.add_token(token)
            detok.take_delta(finished=False)

    return traced_lines(stream) / len(ids)


def test_work_per_token_does_not_grow_with_the_stop_strings(tokenizer: Any) -> None:
    ids = tokenizer.encode(" abab ab aba" * 20)
    # Long stop strings that share the text's prefix keep many tails "possible".
    maximal = [("ab" * 128)[: 255] + chr(0x4E00 + i) for i in range(64)]
    small = ["Zq"]
    assert lines_per_token(tokenizer, maximal, ids) <= 2 * lines_per_token(tokenizer, small, ids)
