"""Hermes / Qwen tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Qwen2.5, Qwen3 and the Hermes models write each call as a JSON object between these tags,
one block per call (several in a row are parallel calls), possibly after some text. Text
around the blocks is the answer; a block that is not a call object is answer text too.
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

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


class _At(enum.Enum):
    TEXT = 0
    CALL = 1
    AFTER_CALL = 2  # whitespace, then the closing tag


class HermesParser:
    """Streams answer text and calls out of Hermes-style output."""

    def __init__(self, names: ToolNames = None) -> None:
        self._names = names
        self._buf = ""
        self._at = _At.TEXT
        self._call: StreamedCall | None = None

    def feed(self, text: str, out: ParsedOutput) -> None:
        self._buf += text
        self._run(out, final=False)

    def finish(self, out: ParsedOutput) -> None:
        self._run(out, final=True)
        if self._at is _At.CALL and self._call is not None and not self._call.opened:
            out.add_content(self._call.give_back())  # an unclosed block that never called
        self._at = _At.TEXT
        out.end_content()

    def _run(self, out: ParsedOutput, final: bool) -> None:
        buf, i = self._buf, 0
        while i < len(buf):
            if self._at is _At.TEXT:
                found = buf.find(OPEN_TAG, i)
                if found < 0:
                    end = len(buf) - (0 if final else held_prefix(buf[i:], (OPEN_TAG,)))
                    out.add_content(buf[i:end])
                    i = end
                    break
                out.add_content(buf[i:found])
                i = found + len(OPEN_TAG)
                self._at, self._call = _At.CALL, StreamedCall(out, OPEN_TAG, self._names)
            elif self._at is _At.CALL:
                assert self._call is not None
                result = self._call.push(buf[i])
                if result is Read.ERROR:
                    if not self._call.opened:
                        out.add_content(self._call.give_back())
                    # a call that broke off ends here; what follows is read again
                    self._at = _At.AFTER_CALL if self._call.opened else _At.TEXT
                    continue
                i += 1
                if result is Read.DONE:
                    self._at = _At.AFTER_CALL
            else:
                if buf[i] in WHITESPACE:
                    i += 1
                elif buf.startswith(CLOSE_TAG, i):
                    i += len(CLOSE_TAG)
                    self._at = _At.TEXT
                elif not final and CLOSE_TAG.startswith(buf[i:]):
                    break  # perhaps the closing tag, not complete yet
                else:
                    self._at = _At.TEXT
        self._buf = buf[i:]
