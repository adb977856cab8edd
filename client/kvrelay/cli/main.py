"""The ``kvrelay`` command: the group, and ``main()``, which turns every user mistake into
one line on stderr (usage errors included) instead of click's usage block or a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from kvrelay import KvrelayError, __version__
from kvrelay.cli.adapters_cmd import adapters
from kvrelay.cli.bench import bench
from kvrelay.cli.chat import chat
from kvrelay.cli.compose_cmd import compose
from kvrelay.cli.config import validate_environment
from kvrelay.cli.env_cmd import env
from kvrelay.cli.errors import CliError, one_line
from kvrelay.cli.functions_cmd import functions
from kvrelay.cli.gateway_cmd import gateway
from kvrelay.cli.generate import generate
from kvrelay.cli.metrics_cmd import metrics
from kvrelay.cli.models import models
from kvrelay.cli.up import up
from kvrelay.cli.worker_cmd import worker

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(name="kvrelay", context_settings=CONTEXT)
@click.version_option(__version__, prog_name="kvrelay")
def cli() -> None:
    """kvrelay: queue-backed LLM inference over Redis and Celery.

    Start here: `kvrelay up` runs a whole stack on this machine and answers a question;
    `kvrelay up --serve` keeps it running for `kvrelay generate` and `kvrelay chat`.
    Settings come from flags and KVRELAY_* variables (`kvrelay env`).
    """
    if click.get_current_context().invoked_subcommand == "env":
        return  # listing the variables must work while one of them is wrong
    for warning in validate_environment():
        click.echo(f"kvrelay: warning: {warning}", err=True)


for command in (up, worker, gateway, metrics, generate, chat, models, adapters, bench, env,
                functions, compose):
    cli.add_command(command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvrelay`` script; returns the exit status."""
    try:
        result = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="kvrelay",
            standalone_mode=False,
        )
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "kvrelay"
        click.echo(
            f"{where}: error: {one_line(exc.format_message())} (see '{where} --help')", err=True
        )
        return exc.exit_code
    except click.ClickException as exc:
        CliError(exc.format_message()).show() if not isinstance(exc, CliError) else exc.show()
        return exc.exit_code
    except KvrelayError as exc:
        CliError(str(exc)).show()
        return 1
    except click.Abort:
        click.echo("kvrelay: interrupted", err=True)
        return 130
    except BrokenPipeError:
        # The reader went away (`kvrelay generate ... | head`): not an error of ours.
        sys.stderr.close()
        return 0
    return result if isinstance(result, int) else 0
