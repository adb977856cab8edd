"""An incremental JSON checker for one value, fed a character at a time.

Tool-call arguments stream while the model writes them, so the parsers must know, at
each character, whether it still belongs to the value, ends it, or breaks it. This is a
push-down recogniser of RFC 8259 (strings with their escapes, numbers, literals, nested
containers): it keeps no copy of the text, only where it stands.
"""

from __future__ import annotations

import enum
import re

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_WHITESPACE = frozenset(" \t\n\r")
_ESCAPES = frozenset('"\\/bfnrtu')
_HEX = frozenset("0123456789abcdefABCDEF")
_LITERALS = {"t": "true", "f": "false", "n": "null"}


class Step(enum.Enum):
    """What one character did to the value."""

    MORE = "more"  # consumed; the value goes on
    DONE = "done"  # consumed; it closed the value
    ENDED_BEFORE = "ended_before"  # not consumed: the value (a number) ended before it
    ERROR = "error"  # not consumed: it cannot continue the value


class _Expect(enum.Enum):
    VALUE = 0  # a value (after ':' or ',' in an array, or at the start)
    VALUE_OR_CLOSE = 1  # after '['
    KEY_OR_CLOSE = 2  # after '{'
    KEY = 3  # after ',' in an object
    COLON = 4
    COMMA_OR_CLOSE = 5


class JsonValue:
    """Recognises one JSON value (leading whitespace skipped) as it arrives."""

    __slots__ = ("_escape", "_expect", "_hex_left", "_in_key", "_literal", "_number",
                 "_stack", "_started", "_string", "done")

    def __init__(self) -> None:
        self._stack: list[str] = []  # open containers: "{" or "["
        self._expect = _Expect.VALUE
        self._string = False
        self._in_key = False
        self._escape = False
        self._hex_left = 0
        self._number: list[str] | None = None
        self._literal: tuple[str, int] | None = None  # (word, characters matched)
        self._started = False
        self.done = False

    @property
    def started(self) -> bool:
        """Whether the value's first character has arrived (whitespace before it aside)."""
        return self._started

    def push(self, ch: str) -> Step:
        if self.done:
            return Step.ERROR
        if self._string:
            return self._push_string(ch)
        if self._number is not None:
            if ch in _NUMBER_CHARS:
                self._number.append(ch)
                return Step.MORE
            if _NUMBER.fullmatch("".join(self._number)) is None:
                return Step.ERROR
            self._number = None
            if not self._stack:
                self.done = True
                return Step.ENDED_BEFORE
            self._value_closed()
            return self.push(ch)
        if self._literal is not None:
            word, matched = self._literal
            if ch != word[matched]:
                return Step.ERROR
            if matched + 1 < len(word):
                self._literal = (word, matched + 1)
                return Step.MORE
            self._literal = None
            return self._value_closed()
        return self._push_structure(ch)

    def end_of_input(self) -> bool:
        """Whether the value is complete if nothing more comes (a number may end here)."""
        if self.done:
            return True
        if self._number is not None and not self._stack:
            return _NUMBER.fullmatch("".join(self._number)) is not None
        return False

    def _push_structure(self, ch: str) -> Step:
        if ch in _WHITESPACE:
            return Step.MORE
        expect = self._expect
        if expect in (_Expect.KEY_OR_CLOSE, _Expect.KEY):
            if ch == '"':
                self._string, self._in_key = True, True
                return Step.MORE
            if ch == "}" and expect is _Expect.KEY_OR_CLOSE:
                return self._close("{")
            return Step.ERROR
        if expect is _Expect.COLON:
            if ch != ":":
                return Step.ERROR
            self._expect = _Expect.VALUE
            return Step.MORE
        if expect is _Expect.COMMA_OR_CLOSE:
            top = self._stack[-1]
            if ch == ",":
                self._expect = _Expect.KEY if top == "{" else _Expect.VALUE
                return Step.MORE
            if (ch == "}" and top == "{") or (ch == "]" and top == "["):
                return self._close(top)
            return Step.ERROR
        if ch == "]" and expect is _Expect.VALUE_OR_CLOSE:
            return self._close("[")
        return self._open_value(ch)

    def _open_value(self, ch: str) -> Step:
        self._started = True
        if ch in "{[":
            self._stack.append(ch)
            self._expect = _Expect.KEY_OR_CLOSE if ch == "{" else _Expect.VALUE_OR_CLOSE
            return Step.MORE
        if ch == '"':
            self._string, self._in_key = True, False
            return Step.MORE
        if ch == "-" or ch in "0123456789":
            self._number = [ch]
            return Step.MORE
        word = _LITERALS.get(ch)
        if word is not None:
            self._literal = (word, 1)
            return Step.MORE
        return Step.ERROR

    def _push_string(self, ch: str) -> Step:
        if self._hex_left:
            if ch not in _HEX:
                return Step.ERROR
            self._hex_left -= 1
            return Step.MORE
        if self._escape:
            if ch not in _ESCAPES:
                return Step.ERROR
            self._escape = False
            self._hex_left = 4 if ch == "u" else 0
            return Step.MORE
        if ch == "\\":
            self._escape = True
            return Step.MORE
        if ch == '"':
            self._string = False
            if self._in_key:
                self._expect = _Expect.COLON
                return Step.MORE
            return self._value_closed()
        return Step.ERROR if ord(ch) < 0x20 else Step.MORE

    def _close(self, bracket: str) -> Step:
        assert self._stack[-1] == bracket
        self._stack.pop()
        self._started = True
        return self._value_closed()

    def _value_closed(self) -> Step:
        if not self._stack:
            self.done = True
            return Step.DONE
        self._expect = _Expect.COMMA_OR_CLOSE
        return Step.MORE
