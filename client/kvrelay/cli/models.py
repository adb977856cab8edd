"""``kvrelay models``: the model names this machine knows, and ``prepare`` to convert one
into the local cache ahead of time (what a worker would otherwise do on first start)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kvrelay.cli.errors import CliError, require_worker_package
from kvrelay.cli.worker_launch import check_model, prepare

if TYPE_CHECKING:
    from kvrelay_worker.loading import GGUFStorage


@click.group("models", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.pass_context
def models(ctx: click.Context, as_json: bool) -> None:
    """List known model names (with `prepare NAME`: convert and cache one)."""
    if ctx.invoked_subcommand is None:
        list_models(as_json)


def list_models(as_json: bool) -> None:
    require_worker_package("kvrelay models")
    from kvrelay_worker.loading import DEFAULT_MODEL, known_models

    infos = known_models()
    if as_json:
        rows = [
            {
                "name": info.name,
                "default": info.name == DEFAULT_MODEL,
                "available": info.available,
                "prepared": info.prepared,
                "source": info.source,
                "description": info.description,
                **_storage_json(info.path),
            }
            for info in infos
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(info.name) for info in infos)
    for info in infos:
        if info.prepared:
            status = "prepared"
        elif info.available:
            status = "installed (converted on first use, or `kvrelay models prepare`)"
        else:
            status = f"not installed: {info.source}"
        default = " (default)" if info.name == DEFAULT_MODEL else ""
        click.echo(f"{info.name:<{width}}  {status}{default}")
        click.echo(f"{'':<{width}}  {info.description}")
        storage = _storage_line(info.path)
        if storage:
            click.echo(f"{'':<{width}}  {storage}")
    list_families()


def _storage(path: Path | None) -> GGUFStorage | None:
    if path is None or path.suffix != ".gguf":
        return None
    from kvrelay_worker.loading import read_gguf_storage

    return read_gguf_storage(path)


def _storage_json(path: Path | None) -> dict[str, object]:
    stored = _storage(path)
    if stored is None:
        return {}
    return {"stored_format": stored.format, "file_tensor_bytes": stored.file_tensor_bytes,
            "resident_weight_bytes": {"none": stored.float32_bytes,
                                      "gguf": stored.kept_quantized_bytes},
            "requantized_types": stored.requantized_types}


def _storage_line(path: Path | None) -> str:
    """Stored format and resident weight bytes (float32, or kept quantized) of a GGUF."""
    stored = _storage(path)
    if stored is None:
        return ""
    requantized = stored.requantized_types
    kept = ("; " + ", ".join(requantized) + " requantized, not bit-exact") if requantized else ""
    return (f"stored: {stored.format}, {stored.file_tensor_bytes / 1e6:.0f} MB; resident "
            f"weights {stored.float32_bytes / 1e6:.0f} MB as float32, "
            f"{stored.kept_quantized_bytes / 1e6:.0f} MB kept quantized "
            f"(KVRELAY_QUANTIZATION=gguf{kept})")


def list_families() -> None:
    """The families a Hugging Face folder (or GGUF file) given as a path may hold."""
    from kvrelay_worker.models.families import FAMILIES

    click.echo("")
    click.echo("Model families (any Hugging Face folder or file of these loads by path):")
    width = max(len(family.title) for family in FAMILIES)
    for family in FAMILIES:
        formats = "HF folder (safetensors)" + (", GGUF" if "gguf" in family.formats else "")
        click.echo(f"  {family.title:<{width}}  {', '.join(family.architectures)}; {formats}"
                   f"; e.g. {family.examples}")


@models.command("prepare")
@click.argument("model", metavar="NAME|PATH|ORG/NAME")
def prepare_cmd(model: str) -> None:
    """Convert NAME (or a .gguf file) into the local cache, then load it once to check it.

    ORG/NAME[@REVISION][:QUANT], a Hugging Face Hub repository, is downloaded into the
    Hugging Face cache first.
    """
    check_model(model)
    folder = prepare(model, progress=True)
    tensors, size = _load_check(folder)
    click.echo(f"{model}: ready in {folder} ({tensors} tensors, {size / 1e6:.0f} MB)")


def _load_check(folder: object) -> tuple[int, int]:
    """Read every weight once, with a progress bar: proves the folder loads."""
    require_worker_package("kvrelay models prepare")
    from tqdm.auto import tqdm

    from kvrelay_worker.loading import load_model_source, safetensors_files

    try:
        files = load_model_source(str(folder), progress=False)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    total = sum(path.stat().st_size for path in safetensors_files(files.path))
    count = 0
    size = 0
    with tqdm(total=total, desc="Loading weights", unit="B", unit_scale=True) as bar:
        for _name, tensor in files.weights():
            count += 1
            nbytes = tensor.numel() * tensor.element_size()
            size += nbytes
            bar.update(nbytes)
        bar.update(max(0, total - bar.n))  # the files' headers
    return count, size
