"""``kvrelay up``: a whole stack on this machine, for a demo or for local development.

Starts Redis (``KVRELAY_REDIS_URL`` when set, else a private server on a free port), one
worker for the model (CUDA when present, else CPU; ``--workers N`` and ``--gpus 0,1`` for
more), waits for every worker's heartbeat,
then either streams the answer to one prompt and stops everything, or (``--serve``)
keeps running until Ctrl-C and tells clients where Redis is.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from kvrelay import Client, KvrelayError
from kvrelay.cli import stack_file
from kvrelay.cli.config import env_float
from kvrelay.cli.errors import CliError, require_worker_package
from kvrelay.cli.gateway_cmd import require_gateway_extra
from kvrelay.cli.gpu_ids import GpuIds
from kvrelay.cli.options import (
    WORKER_SETTING_FLAGS,
    picked,
    redis_url_option,
    sampling_options,
    seconds_option,
    worker_options,
)
from kvrelay.cli.signals import interrupts_held, stop_signals_interrupt
from kvrelay.cli.stack import LocalStack
from kvrelay.cli.streaming import job_options, print_summary, stream_to_stdout, with_system
from kvrelay.cli.target import namespace
from kvrelay.cli.worker_launch import prepare_if_needed, worker_environment, worker_plans
from kvrelay.connection import redact_url

DEFAULT_PROMPT = "In two sentences, why do language models generate text one token at a time?"
# How long the worker may drain on stop; the demo holds no job worth waiting for.
UP_SHUTDOWN_GRACE = "5"
# Stands in for the private Redis's URL while the settings are validated.
_PLACEHOLDER_URL = "redis://127.0.0.1:0/0"


@click.command("up")
@click.argument("prompt", required=False)
@click.option(
    "--serve",
    is_flag=True,
    help="Keep the stack running (after answering PROMPT, if given) until Ctrl-C.",
)
@click.option(
    "--http",
    "http_port",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="With --serve: also serve the OpenAI-compatible API on this port (kvrelay[gateway]).",
)
@worker_options
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=1,
    metavar="N",
    help="Worker processes per device (per GPU with --gpus) [default: 1].",
)
@click.option(
    "--gpus",
    type=GpuIds(),
    default=(),
    help="One worker per GPU, e.g. 0,1 (each on cuda:<id>) [default: the --device].",
)
@redis_url_option("Use this Redis instead of starting a private one.")
@click.option(
    "--redis-port",
    type=click.IntRange(0, 65535),
    default=0,
    metavar="PORT",
    help="Port of the private Redis [default: a free one].",
)
@sampling_options(temperature=0.0)
@seconds_option(
    "--startup-timeout",
    "STARTUP_TIMEOUT",
    300.0,
    "How long the worker may take to load the model.",
)
@click.option(
    "--worker-logs",
    is_flag=True,
    help="Show the worker's log on stderr [default: a file, shown on failure].",
)
def up(prompt: str | None, **params: Any) -> int:
    """Start Redis and a worker (or several), stream the answer to PROMPT, stop everything.

    Without PROMPT a default question is asked. With --serve the stack stays up and
    `kvrelay generate` / `kvrelay chat` in other shells use it.
    """
    require_worker_package("kvrelay up")
    if params["http_port"] is not None:
        if not params["serve"]:
            raise click.UsageError("--http needs --serve")
        require_gateway_extra()
    redis_url: str | None = params["redis_url"]
    settings = picked(params, WORKER_SETTING_FLAGS) | {"redis_url": redis_url or _PLACEHOLDER_URL}
    env = worker_environment(os.environ, settings)
    env.setdefault("KVRELAY_SHUTDOWN_GRACE", UP_SHUTDOWN_GRACE)
    if params["gpus"] and params["device"] is not None:
        raise click.UsageError("--gpus sets each worker's device: leave out --device")
    plans = worker_plans(env, params["workers"], params["gpus"])
    plan = plans[0]
    prepare_if_needed(plan.model, plan.env)
    serve: bool = params["serve"]
    question = prompt if prompt is not None else (None if serve else DEFAULT_PROMPT)
    options = job_options(plan.served_model, params, env_float("STREAM_TIMEOUT", 120.0))

    workdir = Path(tempfile.mkdtemp(prefix="kvrelay-up-"))
    stack = LocalStack(plans, workdir, worker_logs_to_stderr=params["worker_logs"])
    interrupted = False
    try:
        with stop_signals_interrupt():
            try:
                _run(stack, params, question, options)
            except KeyboardInterrupt:
                interrupted = True
    finally:
        with interrupts_held():
            click.echo("Stopping the stack ...", err=True)
            stack_file.remove_record()
            stack.stop()
    if interrupted and not serve:
        click.echo("Interrupted.", err=True)
        return 130
    click.echo("Stopped.", err=True)
    return 0


def _run(
    stack: LocalStack, params: dict[str, Any], question: str | None, options: dict[str, object]
) -> None:
    redis_url: str | None = params["redis_url"]
    url = stack.start_redis(redis_url, params["redis_port"])
    click.echo(f"Redis: {redact_url(url)}" + ("" if redis_url else " (private)"), err=True)
    stack.start_workers()
    with Client(url, model=stack.plan.served_model, namespace=namespace()) as client:
        stack.wait_ready(client, params["startup_timeout"])
        if question is not None:
            click.secho(f"> {question}", err=True, bold=True)
            try:
                completion = stream_to_stdout(
                    client,
                    with_system(params["system"], [{"role": "user", "content": question}]),
                    options,
                )
            except KvrelayError as exc:
                stack.check_alive()  # a dead worker explains the failure better
                raise CliError(str(exc)) from None
            print_summary(completion)
        if params["serve"]:
            _serve(stack, url, params["http_port"])


def _serve(stack: LocalStack, url: str, http_port: int | None) -> None:
    """Tell clients where the stack is, then watch it until interrupted."""
    record = stack_file.write_record(url, stack.plan.served_model)
    click.echo(f"KVRELAY_REDIS_URL={url}")
    if http_port is not None:
        base = stack.start_gateway(http_port)
        click.echo(f"OPENAI_BASE_URL={base}")
    click.echo(
        f'Serving {stack.plan.served_model}. In another shell: kvrelay generate "Hello" '
        f"(found through {record}), or export KVRELAY_REDIS_URL={redact_url(url)}. "
        "Ctrl-C stops.",
        err=True,
    )
    while True:
        stack.check_alive()
        time.sleep(0.5)
