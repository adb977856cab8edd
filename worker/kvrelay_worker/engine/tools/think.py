"""Reasoning in ``<think>...</think>``, apart from the answer (Qwen3, DeepSeek-R1, QwQ).

A thinking model opens its output with ``<think>``, reasons, closes it and answers. Some
templates (DeepSeek-R1's) put ``<think>`` at the end of the generation prompt, so the
output starts inside the block: ``starts_inside`` says so. Output that does not open
with the tag is all answer; a block never closed is all reasoning. Whitespace that only
lays out the block (after ``<think>``, before and after ``</think>``) belongs to neither.
"""

from __future__ import annotations

import enum

from kvrelay_worker.engine.tools.call_stream import WHITESPACE, held_prefix
from kvrelay_worker.engine.tools.parsed_output import ParsedOutput

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class _At(enum.Enum):
    START = 0  # before the output's first text: the tag may come
    LEAD = 1  # whitespace after <think>
    THINK = 2
    TRAIL = 3  # whitespace after </think>
    ANSWER = 4


class ThinkParser:
    """Splits reasoning (written to the output) from answer text (returned)."""

    def __init__(self, starts_inside: bool = False) -> None:
        self._buf = ""
        self._at = _At.LEAD if starts_inside else _At.START
        self._space = ""  # reasoning whitespace held until reasoning text follows it

    def feed(self, text: str, out: ParsedOutput) -> str:
        """Reasoning goes to ``out``; the answer text found so far is returned."""
        if self._at is _At.ANSWER:
            return text
        self._buf += text
        return self._run(out, final=False)

    def finish(self, out: ParsedOutput) -> str:
        answer = self._run(out, final=True) if self._at is not _At.ANSWER else ""
        self._space = ""
        self._at = _At.ANSWER
        return answer

    def _run(self, out: ParsedOutput, final: bool) -> str:
        buf, i = self._buf, 0
        answer = ""
        while i < len(buf):
            at = self._at
            if at is _At.START:
                body = buf.lstrip()
                if body.startswith(THINK_OPEN):
                    i = len(buf) - len(body) + len(THINK_OPEN)
                    self._at = _At.LEAD
                elif not final and THINK_OPEN.startswith(body):
                    break  # whitespace or the tag's beginning: wait
                else:
                    self._at = _At.ANSWER
            elif at is _At.LEAD or at is _At.TRAIL:
                if buf[i] in WHITESPACE:
                    i += 1
                else:
                    self._at = _At.THINK if at is _At.LEAD else _At.ANSWER
            elif at is _At.THINK:
                found = buf.find(THINK_CLOSE, i)
                if found >= 0:
                    self._add_reasoning(buf[i:found], out)
                    self._space = ""
                    i = found + len(THINK_CLOSE)
                    self._at = _At.TRAIL
                    continue
                end = len(buf) - (0 if final else held_prefix(buf[i:], (THINK_CLOSE,)))
                self._add_reasoning(buf[i:end], out)
                i = end
                break
            else:
                answer, i = buf[i:], len(buf)
        self._buf = buf[i:]
        return answer

    def _add_reasoning(self, text: str, out: ParsedOutput) -> None:
        body = text.rstrip(" \t\n\r")
        if body:
            out.reasoning.append(self._space + body)
            self._space = ""
        self._space += text[len(body):]
