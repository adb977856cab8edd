"""``kvrelay compose --gpus 0,1,2,3``: a compose override with one worker per GPU.

compose.yaml's ``worker`` reserves every GPU and uses the first one it sees. The override
pins it to the first listed GPU (``CUDA_VISIBLE_DEVICES``) and adds ``worker-gpu<id>``
for each other one: a copy of ``worker`` as compose.yaml defines it now, read from the
file (``extends`` cannot be used: a service with ``depends_on`` cannot be extended), with
its own GPU and metrics port. Regenerate it after editing compose.yaml's worker.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import click

from kvrelay.cli.errors import CliError
from kvrelay.cli.gpu_ids import GpuIds

DEFAULT_OUTPUT = "compose.gpus.yaml"
METRICS_PORT = 9400  # the worker's port inside its container, and the first one on the host


def read_worker(compose_file: Path) -> dict[str, Any]:
    """compose.yaml's ``worker`` service, anchors resolved."""
    try:
        import yaml
    except ImportError:  # a client-only install: the worker package brings PyYAML
        raise CliError("kvrelay compose reads compose.yaml with PyYAML: pip install pyyaml") \
            from None
    try:
        data = yaml.safe_load(compose_file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"cannot read {compose_file}: {exc}") from None
    try:
        worker = data["services"]["worker"]
    except (TypeError, KeyError):
        raise CliError(f"{compose_file} has no `worker` service") from None
    assert isinstance(worker, dict)
    return worker


def override(worker: dict[str, Any], gpus: tuple[int, ...]) -> dict[str, Any]:
    """The override's services: ``worker`` on the first GPU, a full copy on each other."""
    first, *others = gpus
    services: dict[str, Any] = {"worker": {"environment": {"CUDA_VISIBLE_DEVICES": str(first)}}}
    for n, gpu in enumerate(others, 1):
        service = copy.deepcopy(worker)
        service["environment"] = {**service.get("environment", {}),
                                  "CUDA_VISIBLE_DEVICES": str(gpu)}
        service["ports"] = [f"127.0.0.1:{METRICS_PORT + n}:{METRICS_PORT}"]
        services[f"worker-gpu{gpu}"] = service
    return {"services": services}


def override_text(compose_file: Path, gpus: tuple[int, ...], output: str) -> str:
    import yaml

    body = yaml.safe_dump(override(read_worker(compose_file), gpus), sort_keys=False,
                          width=100)
    return (f"# One kvrelay worker per GPU ({','.join(map(str, gpus))}): `kvrelay compose`.\n"
            f"#   {run_command(compose_file, output)}\n{body}")


def run_command(compose_file: Path, output: str) -> str:
    return f"docker compose -f {compose_file} -f {output} up -d"


@click.command("compose")
@click.option("--gpus", type=GpuIds(), required=True,
              help="GPU indices, e.g. 0,1,2,3: one worker service each.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), metavar="FILE",
              help=f"Write the override to FILE (e.g. {DEFAULT_OUTPUT}) [default: print it].")
@click.option("--compose-file", "-f", default="compose.yaml", show_default=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="FILE",
              help="The compose file whose `worker` is copied.")
def compose(gpus: tuple[int, ...], output: str | None, compose_file: Path) -> None:
    """Print (or write) a compose override with one worker per GPU of a multi-GPU host.

    The first GPU keeps the `worker` service; each other one gets `worker-gpu<id>`, with
    its metrics on the next host port (9401, 9402, ...).
    """
    text = override_text(compose_file, gpus, output or DEFAULT_OUTPUT)
    if output is None:
        click.echo(text, nl=False)
        return
    Path(output).write_text(text, encoding="utf-8")
    click.echo(f"Wrote {output}; start the stack with:\n  {run_command(compose_file, output)}",
               err=True)
