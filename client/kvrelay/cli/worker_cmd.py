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

import click

from kvrelay.cli.finite_float import FiniteFloatRange
from kvrelay.cli.options import redis_url_option, worker_options
from kvrelay.cli.worker_launch import plan_worker, prepare_if_needed, worker_environment


@click.command("worker")
@worker_options
@redis_url_option("Redis shared with clients [default: redis://localhost:6379/0].")
@click.option(
    "--shutdown-grace",
    envvar="KVRELAY_SHUTDOWN_GRACE",
    show_envvar=True,
    type=FiniteFloatRange(min=0),
    metavar="SECONDS",
    help="On SIGTERM, time running jobs get to finish [default: 30].",
)
@click.option(
    "--loglevel",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option("--events", is_flag=True, help="Send Celery task events (for Flower).")
@click.option("--hostname", metavar="NAME", help="Celery node name [default: kvrelay-<model>@%h].")
@click.option(
    "--prepare/--no-prepare",
    default=True,
    show_default=True,
    help="Convert the model into the cache before starting (with a progress bar).",
)
@click.option("--dry-run", is_flag=True, help="Print the environment and command, run nothing.")
def worker(
    model: str | None,
    model_name: str | None,
    device: str | None,
    dtype: str | None,
    concurrency: int | None,
    max_model_len: int | None,
    metrics_port: int | None,
    redis_url: str | None,
    shutdown_grace: float | None,
    loglevel: str,
    events: bool,
    hostname: str | None,
    prepare: bool,
    dry_run: bool,
) -> None:
    """Run a worker for one model until SIGTERM or Ctrl-C.

    Any other worker setting is read from its KVRELAY_* variable (see `kvrelay env`).
    """
    env = worker_environment(
        os.environ,
        {
            "model": model,
            "model_name": model_name,
            "device": device,
            "dtype": dtype,
            "concurrency": concurrency,
            "max_model_len": max_model_len,
            "metrics_port": metrics_port,
            "redis_url": redis_url,
            "shutdown_grace": shutdown_grace,
        },
    )
    plan = plan_worker(env, loglevel=loglevel.upper(), events=events, hostname=hostname)
    if dry_run:
        for name in sorted(plan.env):
            if name.startswith("KVRELAY_"):
                click.echo(f"{name}={shlex.quote(plan.env[name])}")
        click.echo(shlex.join(plan.argv))
        return
    if prepare:
        prepare_if_needed(plan.model)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(plan.argv[0], plan.argv, plan.env)
