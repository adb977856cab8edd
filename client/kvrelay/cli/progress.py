"""A one-line progress indication for waits whose length nobody knows in advance
(a worker loading its model): a spinner with the elapsed time on a terminal, plain
start and end lines otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
import time
from typing import IO, Any

import click

_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_ASCII_FRAMES = "|/-\\"


class Spinner:
    """``tick()`` redraws at most ten times a second; ``done()`` leaves one final line."""

    def __init__(self, label: str, *, stream: IO[Any] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        encoding = (getattr(self.stream, "encoding", None) or "").lower()
        self.frames = _FRAMES if "utf" in encoding else _ASCII_FRAMES
        self.label = label
        self.started = time.monotonic()
        self._drawn = 0.0
        self._frame = 0
        if not self.live:
            self._line(f"{label} ...")

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def tick(self, label: str | None = None) -> None:
        if label is not None and label != self.label:
            self.label = label
            if not self.live:
                self._line(f"{label} ...")
        now = time.monotonic()
        if not self.live or now - self._drawn < 0.1:
            return
        self._drawn = now
        self._frame = (self._frame + 1) % len(self.frames)
        frame = self.frames[self._frame]
        click.echo(
            f"\r\x1b[2K{frame} {self.label} {self.elapsed:5.1f}s", nl=False, file=self.stream
        )

    def done(self, message: str) -> None:
        if self.live:
            click.echo("\r\x1b[2K", nl=False, file=self.stream)
        self._line(message)

    def _line(self, text: str) -> None:
        click.echo(text, file=self.stream)
