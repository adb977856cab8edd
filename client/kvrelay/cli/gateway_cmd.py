"""``kvrelay gateway``: serve the OpenAI-compatible HTTP API over the queue.

Needs the extra (``pip install "kvrelay[gateway]"``); imported only when the command runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import click

from kvrelay.cli.errors import CliError
from kvrelay.cli.options import redis_url_option
from kvrelay.connection import redact_url

GATEWAY_INSTALL_HINT = 'pip install "kvrelay[gateway]"'


def require_gateway_extra() -> None:
    for module in ("starlette", "uvicorn", "prometheus_client"):
        if importlib.util.find_spec(module) is None:
            raise CliError(f"the gateway needs {module}: {GATEWAY_INSTALL_HINT}")


@click.command("gateway")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="KVRELAY_GATEWAY_HOST",
              show_envvar=True, help="Address to listen on (0.0.0.0 for every interface).")
@click.option("--port", default=8000, show_default=True, envvar="KVRELAY_GATEWAY_PORT",
              show_envvar=True, type=click.IntRange(0, 65535))
@redis_url_option("Redis shared with the workers [default: redis://localhost:6379/0].")
@click.option("--api-keys-file", envvar="KVRELAY_GATEWAY_API_KEYS_FILE", show_envvar=True,
              type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="'key=tenant' per line; with keys, a request without a valid one gets 401.")
@click.option("--max-queue", envvar="KVRELAY_GATEWAY_MAX_QUEUE", show_envvar=True,
              type=click.IntRange(min=0), metavar="N",
              help="Answer 429 while a model's queue holds more than N jobs.")
@click.option("--job-timeout", envvar="KVRELAY_GATEWAY_JOB_TIMEOUT", show_envvar=True,
              type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Answer 504 for a job unfinished after this long [default: 600].")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              metavar="FILE", help="TOML file of request limits and tenant policies "
              "(docs/gateway.md).")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def gateway(host: str, port: int, redis_url: str | None, api_keys_file: str | None,
            max_queue: int | None, job_timeout: float | None, config_file: str | None,
            log_level: str) -> None:
    """Serve /v1/chat/completions, /v1/completions and /v1/models until Ctrl-C.

    Any OpenAI client works: OpenAI(base_url="http://HOST:PORT/v1", api_key=...).
    """
    require_gateway_extra()
    from kvrelay.gateway.config_file import load_config
    from kvrelay.gateway.server import serve
    from kvrelay.gateway.settings import GatewaySettings

    env = dict(os.environ)
    if redis_url:
        env["KVRELAY_REDIS_URL"] = redis_url
    if api_keys_file:
        env["KVRELAY_GATEWAY_API_KEYS_FILE"] = api_keys_file
    try:
        settings = GatewaySettings.from_env(env)
        settings = dataclasses.replace(
            settings,
            max_queue=max_queue if max_queue is not None else settings.max_queue,
            job_timeout=job_timeout if job_timeout is not None else settings.job_timeout,
        )
        if config_file:
            config = load_config(config_file)
            settings = dataclasses.replace(settings, limits=config.limits,
                                           policies=config.policies)
    except (ValueError, OSError) as exc:
        raise CliError(f"gateway settings: {exc}") from None
    click.echo(f"kvrelay gateway: serving http://{host}:{port}/v1 "
               f"(Redis {redact_url(settings.redis_url)})", err=True)
    serve(settings, host=host, port=port, log_level=log_level)
