"""The incremental JSON checker the call parsers stream arguments with.

Every JSON text Python writes (any separators, indentation, escapes) must be taken a
character at a time, closing exactly at its last character; texts ``json.loads`` refuses
must be refused at the first character that cannot continue them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvrelay_worker.engine.tools.json_value import JsonValue, Step

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                  max_size=4),
    max_leaves=12,
)


def feed(text: str) -> tuple[JsonValue, list[Step]]:
    value = JsonValue()
    steps = []
    for ch in text:
        step = value.push(ch)
        steps.append(step)
        if step is not Step.MORE:
            break
    return value, steps


@settings(max_examples=150, deadline=None)
@given(json_values, st.sampled_from([None, 2]), st.booleans())
def test_every_json_text_closes_at_its_last_character(
        value: Any, indent: int | None, ascii_only: bool) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    checker, steps = feed(text)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # A number has no closing character: it ends at what follows it, or at the end.
        assert steps == [Step.MORE] * len(text)
        assert checker.end_of_input()
        assert checker.push(",") is Step.ENDED_BEFORE
    else:
        assert steps == [Step.MORE] * (len(text) - 1) + [Step.DONE]
        assert checker.done
        assert checker.end_of_input()


@pytest.mark.parametrize(("text", "bad_at"), [
    ('{"a" 1}', 5),
    ("[1,]", 3),
    ("[1 2]", 3),
    ('{"a": 1,}', 8),
    ("{1: 2}", 1),
    ("tru e", 3),
    ('"a\x01"', 2),
    ('"\\x"', 2),
    ('"\\u12g4"', 5),
    ("]", 0),
    ("{]", 1),
    ("[}", 1),
])
def test_invalid_text_is_refused_where_it_breaks(text: str, bad_at: int) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    _, steps = feed(text)
    assert steps[-1] is Step.ERROR
    assert len(steps) - 1 == bad_at


@pytest.mark.parametrize("text", ["01", "1.", "-", "1e", "1.5e+"])
def test_malformed_numbers_are_refused_when_they_end(text: str) -> None:
    checker, steps = feed(text)
    assert steps == [Step.MORE] * len(text)
    assert not checker.end_of_input()
    assert checker.push("}") is Step.ERROR


def test_leading_whitespace_is_not_the_value() -> None:
    checker = JsonValue()
    for ch in " \n\t":
        assert checker.push(ch) is Step.MORE
    assert not checker.started
    assert checker.push("[") is Step.MORE
    assert checker.started
    assert [checker.push(ch) for ch in "]"] == [Step.DONE]
    assert checker.push(" ") is Step.ERROR  # nothing follows a finished value
