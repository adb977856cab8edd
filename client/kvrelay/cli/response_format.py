"""``--json-schema FILE``, ``--regex`` and ``--choice``: the SDK's ``response_format``.

The flags only shape the keyword; its bounds (schema size, pattern length, choices) are
checked by ``kvrelay.protocol`` through the SDK, like every sampling option.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

FLAGS = ("json_schema", "regex", "choice")


def response_format_flags() -> list[Callable[[F], F]]:
    """The three flags (at most one may be given)."""
    return [
        click.option("--json-schema", type=click.Path(exists=True, dir_okay=False,
                                                      path_type=Path),
                     default=None, metavar="FILE",
                     help="Answer with JSON valid against the JSON Schema in FILE."),
        click.option("--regex", default=None, metavar="PATTERN",
                     help="Answer with text that matches PATTERN, whole."),
        click.option("--choice", multiple=True, metavar="TEXT",
                     help="Answer with exactly one TEXT (repeat the flag for each choice)."),
    ]


def response_format_from(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``response_format`` keyword the flags ask for, or None."""
    schema_file: Path | None = params.get("json_schema")
    regex: str | None = params.get("regex")
    choices: tuple[str, ...] = tuple(params.get("choice") or ())
    given = [name for name, value in zip(FLAGS, (schema_file, regex, choices)) if value]
    if len(given) > 1:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise click.UsageError(f"give one of --json-schema, --regex, --choice (got {flags})")
    if schema_file is not None:
        try:
            schema = json.loads(schema_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise click.BadParameter(f"{schema_file}: {exc}",
                                     param_hint="--json-schema") from None
        return {"type": "json_schema", "json_schema": {"name": schema_file.stem,
                                                       "schema": schema}}
    if regex:
        return {"type": "regex", "pattern": regex}
    if choices:
        return {"type": "choice", "choices": list(choices)}
    return None
