"""``kvrelay env``: every ``KVRELAY_*`` variable, its default, its meaning, and the value
set here (``--markdown`` prints the README's configuration table)."""

from __future__ import annotations

import os

import click

from kvrelay.cli.config import VARIABLES, Variable


def markdown_table(variables: tuple[Variable, ...] = VARIABLES) -> str:
    rows = ["| Variable | Default | Used by | Meaning |", "|---|---|---|---|"]
    for v in variables:
        default = f"`{v.default}`" if not v.default.startswith("(") else v.default
        users = ", ".join(v.users.split())
        rows.append(f"| `{v.name}` | {default} | {users} | {v.meaning} |")
    return "\n".join(rows)


@click.command("env")
@click.option("--markdown", is_flag=True, help="Print the table as Markdown.")
def env(markdown: bool) -> None:
    """List every KVRELAY_* variable with its default and current value."""
    if markdown:
        click.echo(markdown_table())
        return
    width = max(len(v.name) for v in VARIABLES)
    for v in VARIABLES:
        current = os.environ.get(v.name)
        if current:
            value = f"= {current}"
        else:
            value = v.default if v.default.startswith("(") else f"(default {v.default})"
        click.echo(f"{v.name:<{width}}  {value}")
        click.secho(f"{'':<{width}}  {v.meaning}", dim=True)
