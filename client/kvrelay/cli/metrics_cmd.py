"""``kvrelay metrics``: the queue depth of every model as Prometheus metrics, for setups
without a gateway (whose ``/metrics`` has the same gauges).

Each scrape reads Redis then (``kvrelay.queue_depth``: a few round trips, whatever the
keyspace); nothing is polled between scrapes. ``--once`` prints the text and exits, for a
textfile collector or a quick look. Needs ``prometheus_client`` (``kvrelay[gateway]``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal

import click

from kvrelay.cli.errors import CliError
from kvrelay.cli.gateway_cmd import GATEWAY_INSTALL_HINT
from kvrelay.cli.options import redis_url_option
from kvrelay.cli.target import namespace, redis_url_for
from kvrelay.connection import redact_url

DEFAULT_PORT = 9410  # beside the workers' 9400 (compose publishes one there)


@click.command("metrics")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 for every interface; no authentication).")
@click.option("--port", default=DEFAULT_PORT, show_default=True,
              type=click.IntRange(0, 65535), help="Port of /metrics (0: any free one).")
@redis_url_option("Redis shared with the workers [default: redis://localhost:6379/0].")
@click.option("--namespace", "namespaces", multiple=True, metavar="NAME",
              help="A namespace to report (repeat for several) [default: KVRELAY_NAMESPACE, "
              "else the default one].")
@click.option("--model", "models", multiple=True, metavar="NAME",
              help="Report this model even while nothing serves or queues it (repeatable).")
@click.option("--once", is_flag=True, help="Print the metrics once and exit.")
def metrics(host: str, port: int, redis_url: str | None, namespaces: tuple[str, ...],
            models: tuple[str, ...], once: bool) -> None:
    """Serve every model's queue depth as Prometheus metrics at /metrics."""
    if importlib.util.find_spec("prometheus_client") is None:
        raise CliError(f"kvrelay metrics needs prometheus_client: {GATEWAY_INSTALL_HINT}")
    url, _ = redis_url_for(redis_url)
    asyncio.run(_run(url, namespaces or (namespace(),), models, host, port, once))


async def _run(url: str, namespaces: tuple[str, ...], models: tuple[str, ...], host: str,
               port: int, once: bool) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    from kvrelay.cli.metrics_http import serve_metrics
    from kvrelay.client import AsyncClient
    from kvrelay.errors import KvrelayError
    from kvrelay.queue_metrics import QueueDepthCollector

    try:
        clients = {ns: AsyncClient(url, namespace=ns, require_worker=False)
                   for ns in dict.fromkeys(namespaces)}
    except KvrelayError as exc:
        raise CliError(str(exc)) from None
    collector = QueueDepthCollector(clients, models)
    registry = CollectorRegistry()
    registry.register(collector)

    async def render() -> bytes:
        await collector.refresh()
        return generate_latest(registry)

    try:
        if once:
            text = await render()
            for ns, error in collector.errors.items():
                raise CliError(f"could not read the queues of namespace "
                               f"{ns or '(default)'}: {error}")
            click.echo(text.decode(), nl=False)
            return
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)

        def ready(bound: int) -> None:
            click.echo(f"kvrelay metrics: serving http://{host}:{bound}/metrics "
                       f"(Redis {redact_url(url)})", err=True)

        try:
            await serve_metrics(host, port, render, CONTENT_TYPE_LATEST, stop, ready)
        except OSError as exc:
            raise CliError(f"cannot listen on {host}:{port}: {exc}") from None
    finally:
        for client in clients.values():
            await client.aclose()
