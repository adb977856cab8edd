"""Pieces every call parser shares: a call object streaming into the output, a JSON array
of call objects, and how much of a text's tail may still become a marker."""

from __future__ import annotations

import enum
from collections.abc import Iterable

from kvrelay_worker.engine.tools.call_object import CallObjectReader, Read
from kvrelay_worker.engine.tools.parsed_output import ParsedOutput

WHITESPACE = frozenset(" \t\n\r")
# The names a call may have (the request's tools); None: any name.
ToolNames = frozenset[str] | None


def held_prefix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest tail of ``text`` that begins one of ``markers`` (without
    being all of it): text that must wait for the next characters before it is shown."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


class StreamedCall:
    """One call object read into ``out`` as it arrives (name first, arguments in pieces).

    ``prefix`` is the text that announced it (a tag, a separator): if the object turns
    out not to be a call before its name is out, ``give_back`` returns all of it as text.
    A name not among ``names`` (when given: the request's tools) makes it no call.
    """

    def __init__(self, out: ParsedOutput, prefix: str = "",
                 names: ToolNames = None) -> None:
        self._out = out
        self._reader = CallObjectReader()
        self._prefix = prefix
        self._names = names

    @property
    def opened(self) -> bool:
        return self._reader.opened

    def push(self, ch: str) -> Read:
        result = self._reader.push(ch)
        if result is Read.ERROR:
            return result
        name = self._reader.ready_name
        if name is not None:
            if self._names is not None and name not in self._names:
                self._reader.consumed.pop()  # not taken: the caller reads it again
                return Read.ERROR  # no tool of the request: the object is text
            self._out.open_call(name)
            self._reader.take_name()
        self._out.add_arguments(self._reader.take_arguments())
        if result is Read.DONE:
            self._out.add_arguments(self._reader.close_arguments())
        return result

    def give_back(self) -> str:
        return self._prefix + "".join(self._reader.consumed)


class _Array(enum.Enum):
    OPEN = 0
    ITEM_OR_CLOSE = 1
    ITEM = 2
    COMMA_OR_CLOSE = 3
    NEXT_ITEM = 4
    DONE = 5


class StreamedCallArray:
    """``[{"name": ..., "arguments": ...}, ...]``: each item a call, streamed as it comes
    (Mistral's ``[TOOL_CALLS]`` list and the ``required`` tool choice's output)."""

    def __init__(self, out: ParsedOutput, prefix: str = "", names: ToolNames = None) -> None:
        self._out = out
        self._names = names
        self._at = _Array.OPEN
        self._item: StreamedCall | None = None
        self._consumed: list[str] = [prefix]
        self.opened = False  # whether a call went out (then the array is calls)

    def push(self, ch: str) -> Read:
        result = self._push(ch)
        if result is not Read.ERROR and not self.opened:
            self._consumed.append(ch)
        return result

    def give_back(self) -> str:
        """Everything read, as text (valid only while no call went out)."""
        return "".join(self._consumed)

    def _push(self, ch: str) -> Read:
        at = self._at
        if at is _Array.ITEM:
            assert self._item is not None
            result = self._item.push(ch)
            self.opened = self.opened or self._item.opened
            if result is Read.DONE:
                self._at = _Array.COMMA_OR_CLOSE
                return Read.MORE
            return result
        if ch in WHITESPACE and at is not _Array.DONE:
            return Read.MORE
        if at is _Array.OPEN:
            if ch != "[":
                return Read.ERROR
            self._at = _Array.ITEM_OR_CLOSE
            return Read.MORE
        if at is _Array.ITEM_OR_CLOSE and ch == "]":
            self._at = _Array.DONE
            return Read.DONE
        if at in (_Array.ITEM_OR_CLOSE, _Array.NEXT_ITEM):
            self._at = _Array.ITEM
            self._item = StreamedCall(self._out, names=self._names)
            return self._push(ch)
        if at is _Array.COMMA_OR_CLOSE:
            if ch == ",":
                self._at = _Array.NEXT_ITEM
                return Read.MORE
            if ch == "]":
                self._at = _Array.DONE
                return Read.DONE
        return Read.ERROR
