"""``kvrelay worker``: run one worker process (a Celery worker hosting the engine).

Flags become ``KVRELAY_*`` variables, the settings are validated as the worker reads them,
the model is converted into the cache if needed (with a progress bar), then the process
becomes ``celery -A kvrelay_worker.app worker ...`` (exec: same pid, so SIGTERM from a
supervisor or ``docker stop`` reaches Celery directly and drains running jobs).
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

import click

from kvrelay.cli.finite_float import FiniteFloatRange
from kvrelay.cli.options import (
    WORKER_SETTING_FLAGS,
    env_option,
    picked,
    redis_url_option,
    worker_options,
)
from kvrelay.cli.worker_launch import plan_worker, prepare_if_needed, worker_environment


@click.command("worker")
@worker_options
@redis_url_option("Redis shared with clients [default: redis://localhost:6379/0].")
@env_option(
    "--shutdown-grace",
    "SHUTDOWN_GRACE",
    type=FiniteFloatRange(min=0),
    metavar="SECONDS",
    help="On SIGTERM, time jobs that have sent tokens get to finish [default: 30].",
)
@click.option(
    "--loglevel",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option("--events", is_flag=True, help="Send Celery task events (for Flower).")
@click.option(
    "--hostname",
    metavar="NAME",
    help="Celery node name [default: kvrelay-<model>-<pid>@%h, unique per process].",
)
@click.option(
    "--prepare/--no-prepare",
    default=True,
    show_default=True,
    help="Download (org/name) and convert the model into the caches before starting "
    "(with progress bars).",
)
@click.option("--dry-run", is_flag=True, help="Print the environment and command, run nothing.")
def worker(**params: Any) -> None:
    """Run a worker for one model until SIGTERM or Ctrl-C.

    Any other worker setting is read from its KVRELAY_* variable (see `kvrelay env`).
    """
    settings = picked(params, (*WORKER_SETTING_FLAGS, "redis_url", "shutdown_grace"))
    env = worker_environment(os.environ, settings)
    plan = plan_worker(
        env,
        loglevel=params["loglevel"].upper(),
        events=params["events"],
        hostname=params["hostname"],
    )
    if params["dry_run"]:
        for name in sorted(plan.env):
            if name.startswith("KVRELAY_"):
                click.echo(f"{name}={shlex.quote(plan.env[name])}")
        click.echo(shlex.join(plan.argv))
        return
    if params["prepare"]:
        prepare_if_needed(plan.model, plan.env)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(plan.argv[0], plan.argv, plan.env)
