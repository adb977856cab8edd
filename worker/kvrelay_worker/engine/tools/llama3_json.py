"""Llama 3.x JSON tool calls: ``{"name": ..., "parameters": {...}}`` in the answer.

Llama 3.1-3.3 answer a custom-tool turn with the call object itself (``"parameters"``,
some fine-tunes say ``"arguments"``), several separated by ``;``, sometimes after the
``<|python_tag|>`` special token. An object opening the answer is a candidate whatever
its first key; later in the text, an object starting ``{"name"`` is (the trigger the
``auto`` grammar watches). A candidate that is no call (no name, a name that is not one
of the request's tools) stays text.
"""

from __future__ import annotations

import enum

from kvrelay_worker.engine.tools.call_object import Read
from kvrelay_worker.engine.tools.call_stream import (
    WHITESPACE,
    StreamedCall,
    ToolNames,
    held_prefix,
)
from kvrelay_worker.engine.tools.parsed_output import ParsedOutput

PYTHON_TAG = "<|python_tag|>"
NAME_START = '{"name"'
SEPARATOR = ";"


class _At(enum.Enum):
    START = 0  # leading whitespace; a call object or the python tag may come
    CALL = 1
    AFTER_CALL = 2  # whitespace, then ";" and another call, or the end
    TEXT = 3


class Llama3JsonParser:
    """Streams answer text and calls out of Llama 3 JSON tool-call output."""

    def __init__(self, names: ToolNames = None) -> None:
        self._names = names
        self._buf = ""
        self._at = _At.START
        self._call: StreamedCall | None = None
        self._between = ""  # text read after a call, given back if no call follows

    def feed(self, text: str, out: ParsedOutput) -> None:
        self._buf += text
        self._run(out, final=False)

    def finish(self, out: ParsedOutput) -> None:
        self._run(out, final=True)
        if self._at is _At.CALL and self._call is not None and not self._call.opened:
            out.add_content(self._call.give_back())
        self._at = _At.TEXT
        out.end_content()

    def _run(self, out: ParsedOutput, final: bool) -> None:
        buf, i = self._buf, 0
        while i < len(buf):
            at = self._at
            if at is _At.START:
                i = self._start(buf, i, out, final)
                if self._at is _At.START:
                    break  # whitespace or the tag's beginning: wait
            elif at is _At.CALL:
                assert self._call is not None
                result = self._call.push(buf[i])
                if result is Read.ERROR:
                    if not self._call.opened:
                        out.add_content(self._call.give_back())
                    self._at = _At.AFTER_CALL if self._call.opened else _At.TEXT
                    self._between = ""
                    continue
                i += 1
                if result is Read.DONE:
                    self._at, self._between = _At.AFTER_CALL, ""
            elif at is _At.AFTER_CALL:
                ch = buf[i]
                if ch in WHITESPACE:
                    self._between += ch
                    i += 1
                elif ch == SEPARATOR:
                    i += 1
                    self._open(out, self._between + ch)
                else:
                    self._at = _At.TEXT
            else:
                i = self._text(buf, i, out, final)
                if self._at is _At.TEXT:
                    break
        self._buf = buf[i:]

    def _start(self, buf: str, i: int, out: ParsedOutput, final: bool) -> int:
        start = i
        while i < len(buf) and buf[i] in WHITESPACE:
            i += 1
        if i == len(buf) or (not final and PYTHON_TAG.startswith(buf[i:])):
            if final:
                out.add_content(buf[start:])
                self._at = _At.TEXT
                return len(buf)
            return start
        if buf.startswith(PYTHON_TAG, i):
            self._open(out, buf[start:i + len(PYTHON_TAG)])
            return i + len(PYTHON_TAG)
        if buf[i] == "{":
            self._open(out, buf[start:i])
            return i
        self._at = _At.TEXT
        return start

    def _text(self, buf: str, i: int, out: ParsedOutput, final: bool) -> int:
        """Answer text up to the next tag or call object (then in CALL), or up to what
        may still begin one."""
        tag, obj = buf.find(PYTHON_TAG, i), buf.find(NAME_START, i)
        found = min((f for f in (tag, obj) if f >= 0), default=-1)
        if found < 0:
            end = len(buf) - (0 if final else held_prefix(buf[i:], (PYTHON_TAG, NAME_START)))
            out.add_content(buf[i:end])
            return end
        out.add_content(buf[i:found])
        if found == tag:
            self._open(out, PYTHON_TAG)
            return found + len(PYTHON_TAG)
        self._open(out, "")
        return found

    def _open(self, out: ParsedOutput, prefix: str) -> None:
        self._at, self._call = _At.CALL, StreamedCall(out, prefix, self._names)
