"""``kvrelay adapters``: load, unload and list the LoRA adapters of live workers.

Each command is one call of the SDK's ``client.adapters`` (``kvrelay.adapter_admin``):
a load or unload reaches every live worker it concerns over the control channel and
returns once each has reported what it did.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from kvrelay import BrokerUnavailable, Client, KvrelayError, UnknownModel
from kvrelay.adapter_wire import AdapterResult
from kvrelay.cli.errors import CliError
from kvrelay.cli.finite_float import FiniteFloatRange
from kvrelay.cli.options import redis_url_option
from kvrelay.cli.target import CONNECT_HINT, connected, namespace, redis_url_for, unknown_model

_REDIS_HELP = ("Redis of the workers [default: the running `kvrelay up --serve` stack, else "
               "redis://localhost:6379/0].")
_timeout_option = click.option(
    "--timeout", type=FiniteFloatRange(min=0, min_open=True), default=120.0,
    show_default=True, metavar="SECONDS",
    help="Fail if a worker has not reported within this long.")


@click.group("adapters")
def adapters() -> None:
    """Load, unload and list the LoRA adapters of live workers (docs/adapters.md)."""


@adapters.command("load")
@click.argument("name")
@click.argument("path")
@click.option("--model", metavar="NAME", help="The base model whose workers load it "
              "[default: KVRELAY_MODEL_NAME, KVRELAY_MODEL, the running stack's, or the "
              "only one served].")
@redis_url_option(_REDIS_HELP)
@_timeout_option
def load(name: str, path: str, model: str | None, redis_url: str | None,
         timeout: float) -> None:
    """Load adapter NAME from PATH (a PEFT folder on the workers' machine) on every live
    worker of the model; jobs then name it with lora=NAME."""
    local = Path(path).expanduser()
    sent = str(local.resolve()) if local.exists() else path  # else: a path on the workers
    with connected(redis_url, model) as (client, base):
        try:
            reports = client.adapters.load(name, sent, model=base, timeout=timeout)
        except UnknownModel:
            raise unknown_model(client, base) from None
        except BrokerUnavailable:
            raise
        except KvrelayError as exc:
            raise CliError(str(exc)) from None
    click.echo(f"adapter {name} of {base} loaded on {_workers(reports)}")


@adapters.command("unload")
@click.argument("name")
@click.option("--model", metavar="NAME",
              help="Only from the workers of this base model [default: every worker that "
              "holds it].")
@redis_url_option(_REDIS_HELP)
@_timeout_option
def unload(name: str, model: str | None, redis_url: str | None, timeout: float) -> None:
    """Unload adapter NAME (its running jobs finish; new ones are refused)."""
    with _client(redis_url) as client:
        try:
            reports = client.adapters.unload(name, model=model, timeout=timeout)
        except BrokerUnavailable:
            raise
        except KvrelayError as exc:
            raise CliError(str(exc)) from None
    click.echo(f"adapter {name} unloaded from {_workers(reports)}")


@adapters.command("list")
@click.option("--model", metavar="NAME", help="Only the adapters of this base model.")
@redis_url_option(_REDIS_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def list_adapters(model: str | None, redis_url: str | None, as_json: bool) -> None:
    """The adapters live workers hold: name, base model, workers, path."""
    with _client(redis_url) as client:
        served = client.adapters.list(model)
    if as_json:
        click.echo(json.dumps([{"name": a.name, "base": a.base, "path": a.path,
                                "workers": list(a.workers)} for a in served], indent=2))
        return
    if not served:
        click.echo("no adapters (load one with `kvrelay adapters load NAME PATH`)")
        return
    width = max(len(a.name) for a in served)
    base_width = max(len(a.base) for a in served)
    for a in served:
        click.echo(f"{a.name:<{width}}  {a.base:<{base_width}}  "
                   f"{len(a.workers)} worker(s)  {a.path}")


@contextmanager
def _client(flag_url: str | None) -> Iterator[Client]:
    """A client of the Redis to use (no model needed: these commands name their own)."""
    url, _ = redis_url_for(flag_url)
    try:
        with Client(url, namespace=namespace()) as client:
            yield client
    except BrokerUnavailable as exc:
        raise CliError(f"{exc}; {CONNECT_HINT}") from None


def _workers(reports: dict[str, AdapterResult]) -> str:
    return f"{len(reports)} worker(s): {', '.join(sorted(reports))}"
