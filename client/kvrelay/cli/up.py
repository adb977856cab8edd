"""``kvrelay up``: a whole stack on this machine, for a demo or for local development.

Starts Redis (``KVRELAY_REDIS_URL`` when set, else a private server on a free port), one
worker for the model (CUDA when present, else CPU), waits for the worker's heartbeat,
then either streams the answer to one prompt and stops everything, or (``--serve``)
keeps running until Ctrl-C and tells clients where Redis is.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import click

from kvrelay import Client, KvrelayError
from kvrelay.cli import stack_file
from kvrelay.cli.config import env_float
from kvrelay.cli.errors import CliError, require_worker_package
from kvrelay.cli.finite_float import FiniteFloatRange
from kvrelay.cli.gateway_cmd import require_gateway_extra
from kvrelay.cli.options import redis_url_option, sampling_options, worker_options
from kvrelay.cli.signals import interrupts_held, stop_signals_interrupt
from kvrelay.cli.stack import LocalStack
from kvrelay.cli.streaming import print_summary, sampling_kwargs, stream_to_stdout, with_system
from kvrelay.cli.target import namespace
from kvrelay.cli.worker_launch import plan_worker, prepare_if_needed, worker_environment

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
@redis_url_option("Use this Redis instead of starting a private one.")
@click.option(
    "--redis-port",
    type=click.IntRange(0, 65535),
    default=0,
    metavar="PORT",
    help="Port of the private Redis [default: a free one].",
)
@sampling_options(temperature=0.0)
@click.option(
    "--startup-timeout",
    envvar="KVRELAY_STARTUP_TIMEOUT",
    show_envvar=True,
    type=FiniteFloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="How long the worker may take to load the model.",
)
@click.option(
    "--worker-logs",
    is_flag=True,
    help="Show the worker's log on stderr [default: a file, shown on failure].",
)
def up(
    prompt: str | None,
    serve: bool,
    http_port: int | None,
    model: str | None,
    model_name: str | None,
    device: str | None,
    dtype: str | None,
    concurrency: int | None,
    max_model_len: int | None,
    metrics_port: int | None,
    redis_url: str | None,
    redis_port: int,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    system: str | None,
    startup_timeout: float,
    worker_logs: bool,
) -> int:
    """Start Redis and a worker, stream the answer to PROMPT, stop everything.

    Without PROMPT a default question is asked. With --serve the stack stays up and
    `kvrelay generate` / `kvrelay chat` in other shells use it.
    """
    require_worker_package("kvrelay up")
    if http_port is not None:
        if not serve:
            raise click.UsageError("--http needs --serve")
        require_gateway_extra()
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
            "redis_url": redis_url or _PLACEHOLDER_URL,
        },
    )
    env.setdefault("KVRELAY_SHUTDOWN_GRACE", UP_SHUTDOWN_GRACE)
    plan = plan_worker(env)
    prepare_if_needed(plan.model)
    question = prompt if prompt is not None else (None if serve else DEFAULT_PROMPT)
    options = sampling_kwargs(
        model=plan.served_model,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stream_timeout=env_float("STREAM_TIMEOUT", 120.0),
    )

    workdir = Path(tempfile.mkdtemp(prefix="kvrelay-up-"))
    stack = LocalStack(plan, workdir, worker_logs_to_stderr=worker_logs)
    interrupted = False
    try:
        with stop_signals_interrupt():
            try:
                _run(
                    stack, redis_url, redis_port, startup_timeout, question, serve, system, options,
                    http_port,
                )
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
    stack: LocalStack,
    redis_url: str | None,
    redis_port: int,
    startup_timeout: float,
    question: str | None,
    serve: bool,
    system: str | None,
    options: dict[str, object],
    http_port: int | None = None,
) -> None:
    url = stack.start_redis(redis_url, redis_port)
    click.echo(f"Redis: {url}" + ("" if redis_url else " (private)"), err=True)
    stack.start_worker()
    with Client(url, model=stack.plan.served_model, namespace=namespace()) as client:
        stack.wait_ready(client, startup_timeout)
        if question is not None:
            click.secho(f"> {question}", err=True, bold=True)
            try:
                completion = stream_to_stdout(
                    client, with_system(system, [{"role": "user", "content": question}]), options
                )
            except KvrelayError as exc:
                stack.check_alive()  # a dead worker explains the failure better
                raise CliError(str(exc)) from None
            print_summary(completion)
        if serve:
            _serve(stack, url, http_port)


def _serve(stack: LocalStack, url: str, http_port: int | None) -> None:
    """Tell clients where the stack is, then watch it until interrupted."""
    record = stack_file.write_record(url, stack.plan.served_model)
    click.echo(f"KVRELAY_REDIS_URL={url}")
    if http_port is not None:
        base = stack.start_gateway(http_port)
        click.echo(f"OPENAI_BASE_URL={base}")
    click.echo(
        f'Serving {stack.plan.served_model}. In another shell: kvrelay generate "Hello" '
        f"(found through {record}), or export KVRELAY_REDIS_URL={url}. Ctrl-C stops.",
        err=True,
    )
    while True:
        stack.check_alive()
        time.sleep(0.5)
