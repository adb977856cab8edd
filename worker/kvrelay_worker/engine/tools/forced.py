"""Parsers for outputs that are calls by construction (``tool_choice`` named or required).

Under ``named`` the grammar makes the whole output the arguments of the one function;
under ``required`` it makes the output a JSON list of ``{"name", "arguments"}`` objects.
The model's own call syntax plays no part, so these read the grammar's shapes directly.
"""

from __future__ import annotations

from kvrelay_worker.engine.tools.call_object import Read
from kvrelay_worker.engine.tools.call_stream import WHITESPACE, StreamedCallArray, ToolNames
from kvrelay_worker.engine.tools.parsed_output import ParsedOutput


class NamedCallParser:
    """The whole output is the arguments JSON of ``name``: one call."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._opened = False
        self._space = ""  # trailing whitespace, held until text follows it

    def feed(self, text: str, out: ParsedOutput) -> None:
        if not self._opened:
            text = text.lstrip()
            if not text:
                return
            out.open_call(self._name)
            self._opened = True
        body = text.rstrip()
        if body:
            out.add_arguments(self._space + body)
            self._space = ""
        self._space += text[len(body):]

    def finish(self, out: ParsedOutput) -> None:
        if not self._opened:  # nothing came: the call has no arguments
            out.open_call(self._name)
            out.add_arguments("{}")
            self._opened = True
        self._space = ""


class RequiredCallsParser:
    """The whole output is a JSON list of calls; what does not parse is answer text."""

    def __init__(self, names: ToolNames = None) -> None:
        self._names = names
        self._list: StreamedCallArray | None = None
        self._ended = False  # the list closed or broke: the rest is text

    def feed(self, text: str, out: ParsedOutput) -> None:
        i = 0
        while i < len(text) and not self._ended:
            if self._list is None:
                if text[i] in WHITESPACE:
                    i += 1
                    continue
                self._list = StreamedCallArray(out, names=self._names)
            result = self._list.push(text[i])
            if result is Read.ERROR:
                if not self._list.opened:
                    out.add_content(self._list.give_back())
                self._ended = True
                break
            i += 1
            if result is Read.DONE:
                self._ended = True
        if self._ended:
            out.add_content(text[i:])

    def finish(self, out: ParsedOutput) -> None:
        if self._list is not None and not self._ended and not self._list.opened:
            out.add_content(self._list.give_back())
        self._ended = True
        out.end_content()
