"""The command table (docs/cli.md) documents each command's flags as its ``--help`` lists them.

Every command of ``kvrelay --help`` has a row; each row names, in code spans, every option
its command (and its sub-commands) shows in ``--help``, and no option that does not exist.
A ``--x / --no-x`` pair counts as documented when either name is.
"""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from helpers.readme_tables import code_spans, doc_text, readme_table

from kvrelay.cli.main import cli

_OPTION_LINE = re.compile(r"^\s{2}(-\w, )?(--[\w-]+)( / (--[\w-]+))?")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*|-[a-z])\b")


def help_text(*command: str) -> str:
    result = CliRunner().invoke(cli, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def help_options(*command: str) -> list[tuple[str, ...]]:
    """Each option of ``kvrelay COMMAND --help`` as its names (short, long, negative)."""
    options: list[tuple[str, ...]] = []
    section = ""
    for line in help_text(*command).splitlines():
        if line and not line.startswith(" "):
            section = line
            continue
        match = _OPTION_LINE.match(line) if section == "Options:" else None
        if match and match.group(2) != "--help":
            short, long, _, negative = match.groups()
            names = [long] + ([short[:2]] if short else []) + ([negative] if negative else [])
            options.append(tuple(names))
    return options


def subcommands(*command: str) -> list[str]:
    lines = help_text(*command).split("Commands:\n", 1)
    if len(lines) == 1:
        return []
    return [line.split()[0] for line in lines[1].splitlines() if line.startswith("  ")]


def command_rows() -> dict[str, str]:
    """``{command name: its row's text}`` from docs/cli.md's table of commands."""
    rows = {}
    for first, what, *_ in readme_table("| command | what it does |", doc_text("cli.md")):
        (span,) = code_spans(first)
        words = span.split()
        assert words[0] == "kvrelay", first
        rows[words[1]] = f"{first} {what}"
    return rows


def documented_flags(row: str, command: str) -> set[str]:
    """Flags in code spans that are flags (`--json`, `--args "..."`) or this command's
    usage (`kvrelay models prepare NAME`); not those of other programs it mentions."""
    spans = [s for s in code_spans(row) if s.startswith(("-", f"kvrelay {command}"))]
    return {flag for span in spans for flag in _FLAG.findall(span)}


def test_every_command_has_a_row() -> None:
    assert set(command_rows()) == set(subcommands())


@pytest.mark.parametrize("command", subcommands())
def test_row_lists_the_flags_of_help(command: str) -> None:
    row = command_rows()[command]
    options = help_options(command)
    for sub in subcommands(command):
        assert f"kvrelay {command} {sub}" in row, f"docs/cli.md does not name `kvrelay {command} {sub}`"
        options += help_options(command, sub)
    documented = documented_flags(row, command)
    missing = [names[0] for names in options if not documented & set(names)]
    assert not missing, f"`kvrelay {command}` row misses {missing}"
    known = {name for names in options for name in names}
    unknown = documented - known - {"-h", "--help"}
    assert not unknown, f"`kvrelay {command}` row documents flags it does not have: {unknown}"
