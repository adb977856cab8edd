"""Mistral tool calls, after the ``[TOOL_CALLS]`` special token.

Two forms: Mistral-Instruct v0.3 (tokenizer v3) writes one JSON list,
``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``; newer models (tokenizer v11
on) write each call as ``[TOOL_CALLS]name[ARGS]{...}`` (``[CALL_ID]id`` may come before
``[ARGS]``). Text before the first marker is the answer.
"""

from __future__ import annotations

import enum
import re

from kvrelay_worker.engine.tools.call_object import Read
from kvrelay_worker.engine.tools.call_stream import (
    WHITESPACE,
    StreamedCallArray,
    ToolNames,
    held_prefix,
)
from kvrelay_worker.engine.tools.json_value import JsonValue, Step
from kvrelay_worker.engine.tools.parsed_output import ParsedOutput

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME_CHAR = re.compile(r"[A-Za-z0-9_.\-]")


class _At(enum.Enum):
    TEXT = 0
    DISPATCH = 1  # after the marker: "[" starts a list, a name the newer form
    LIST = 2
    NAME = 3
    CALL_ID = 4
    ARGS = 5


class MistralParser:
    """Streams answer text and calls out of Mistral tool-call output."""

    def __init__(self, names: ToolNames = None) -> None:
        self._names = names
        self._buf = ""
        self._at = _At.TEXT
        self._read = ""  # what the current marker began, given back if it is no call
        self._name = ""
        self._list: StreamedCallArray | None = None
        self._args: JsonValue | None = None

    def feed(self, text: str, out: ParsedOutput) -> None:
        self._buf += text
        self._run(out, final=False)

    def finish(self, out: ParsedOutput) -> None:
        self._run(out, final=True)
        if self._at in (_At.DISPATCH, _At.NAME, _At.CALL_ID):
            out.add_content(self._read)
        elif self._at is _At.LIST and self._list is not None and not self._list.opened:
            out.add_content(self._list.give_back())
        self._at = _At.TEXT
        out.end_content()

    def _run(self, out: ParsedOutput, final: bool) -> None:
        buf, i = self._buf, 0
        while i < len(buf):
            at = self._at
            if at is _At.TEXT:
                found = buf.find(TOOL_CALLS, i)
                if found < 0:
                    end = len(buf) - (0 if final else held_prefix(buf[i:], (TOOL_CALLS,)))
                    out.add_content(buf[i:end])
                    i = end
                    break
                out.add_content(buf[i:found])
                i = found + len(TOOL_CALLS)
                self._at, self._read, self._name = _At.DISPATCH, TOOL_CALLS, ""
            elif at is _At.DISPATCH:
                ch = buf[i]
                if ch in WHITESPACE:
                    self._read += ch
                    i += 1
                elif ch == "[":
                    self._at, self._list = _At.LIST, StreamedCallArray(out, self._read, self._names)
                else:
                    self._at = _At.NAME
            elif at is _At.LIST:
                assert self._list is not None
                result = self._list.push(buf[i])
                if result is Read.ERROR:
                    if not self._list.opened:
                        out.add_content(self._list.give_back())
                    self._at = _At.TEXT
                    continue
                i += 1
                if result is Read.DONE:
                    self._at = _At.TEXT
            elif at is _At.NAME or at is _At.CALL_ID:
                step = self._read_header(buf, i, final)
                if step == 0:
                    break
                if step < 0:  # not a call: the marker and name are text
                    out.add_content(self._read)
                    self._at = _At.TEXT
                    continue
                if buf.startswith(ARGS, i):
                    out.open_call(self._name)
                    self._at, self._args = _At.ARGS, JsonValue()
                self._read += buf[i:i + step]
                i += step
            else:
                i += self._read_args(buf[i], out)
        self._buf = buf[i:]

    def _read_header(self, buf: str, i: int, final: bool) -> int:
        """Characters the name (or call id) takes at ``i``: a marker's length, 1, 0 to
        wait for more, -1 when this cannot be a call header."""
        for marker in (ARGS, CALL_ID):
            if buf.startswith(marker, i):
                if marker == ARGS and (not self._name or (
                        self._names is not None and self._name not in self._names)):
                    return -1
                if marker == CALL_ID:
                    self._at = _At.CALL_ID
                return len(marker)
        rest = buf[i:]
        if not final and (ARGS.startswith(rest) or CALL_ID.startswith(rest)):
            return 0
        if self._at is _At.CALL_ID:
            return 1  # an id: anything up to [ARGS]
        if _NAME_CHAR.fullmatch(buf[i]) is None:
            return -1
        self._name += buf[i]
        return 1

    def _read_args(self, ch: str, out: ParsedOutput) -> int:
        """Characters of ``ch`` consumed (0: the arguments ended before it)."""
        assert self._args is not None
        step = self._args.push(ch)
        if step is Step.ERROR or step is Step.ENDED_BEFORE:
            self._at = _At.TEXT  # the call ends here (cut short if it broke off)
            return 0
        if self._args.started:
            out.add_arguments(ch)
        if step is Step.DONE:
            self._at = _At.TEXT
        return 1
