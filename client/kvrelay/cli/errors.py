"""One-line errors: a user mistake is reported as ``kvrelay: error: ...``, never a traceback."""

from __future__ import annotations

from typing import IO, Any

import click

WORKER_INSTALL_HINT = "pip install kvrelay-worker (or `make install` in the repository)"


def one_line(message: str) -> str:
    """Collapse a message onto one line (exceptions from libraries may span several)."""
    return " ".join(str(message).split())


class CliError(click.ClickException):
    """A problem the user can fix: printed as one line on stderr, exit status 1."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"kvrelay: error: {self.format_message()}", err=True, file=file)


def require_worker_package(what: str) -> None:
    """Fail with an install hint when ``kvrelay_worker`` (torch & co.) is not installed."""
    import importlib.util

    if importlib.util.find_spec("kvrelay_worker") is None:
        raise CliError(f"{what} needs the worker package: {WORKER_INSTALL_HINT}")
