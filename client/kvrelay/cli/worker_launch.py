"""What starting a worker takes: its ``KVRELAY_*`` environment, validated settings, the
model on disk (converted into the cache with a progress bar), and the Celery command.

``kvrelay worker`` execs the command; ``kvrelay up`` spawns it. Both go through here, so a
worker started either way (or by plain ``celery -A kvrelay_worker.app worker`` with the
same variables) runs with exactly the same settings.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import click

from kvrelay.cli.errors import CliError, require_worker_package


@dataclass(frozen=True)
class WorkerPlan:
    """A validated worker: the environment and command that start it."""

    env: dict[str, str]
    argv: list[str]
    model: str  # what is loaded (name or absolute path)
    served_model: str  # what clients ask for
    concurrency: int


def worker_environment(
    base: Mapping[str, str], settings: Mapping[str, object | None]
) -> dict[str, str]:
    """``base`` plus ``KVRELAY_<NAME>`` for every setting given (None: leave as is)."""
    env = dict(base)
    for name, value in settings.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        env[f"KVRELAY_{name.upper()}"] = str(value)
    model = env.get("KVRELAY_MODEL")
    if model and Path(model).expanduser().exists():
        # A path means the same file whatever the worker's working folder.
        env["KVRELAY_MODEL"] = str(Path(model).expanduser().resolve())
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def plan_worker(
    env: dict[str, str],
    *,
    loglevel: str = "INFO",
    events: bool = False,
    hostname: str | None = None,
) -> WorkerPlan:
    """Validate the worker's settings as the worker itself will read them; build its command."""
    require_worker_package("a worker")
    from kvrelay_worker.settings import SettingsError, WorkerSettings

    try:
        settings = WorkerSettings.from_env(env)
    except SettingsError as exc:
        raise CliError(str(exc)) from None
    check_model(settings.model)
    served = settings.served_model
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "kvrelay_worker.app",
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        str(settings.concurrency),
        "--queues",
        settings.keys.celery_queue(served),
        "--hostname",
        hostname or f"kvrelay-{served}-{os.getpid()}@%h",
        "--loglevel",
        loglevel,
        "--without-gossip",
        "--without-mingle",
    ]
    if events:
        argv.append("--task-events")
    return WorkerPlan(env, argv, settings.model, served, settings.concurrency)


def worker_plans(env: dict[str, str], workers: int = 1,
                 gpus: tuple[int, ...] = ()) -> list[WorkerPlan]:
    """``workers`` processes per device: on each GPU of ``gpus`` (``cuda:<id>``), else on
    the device the settings name. Several get Celery node names of their own."""
    devices: list[str | None] = [f"cuda:{gpu}" for gpu in gpus] or [None]
    envs = [env if device is None else {**env, "KVRELAY_DEVICE": device}
            for device in devices for _ in range(workers)]
    first = plan_worker(envs[0])
    if len(envs) == 1:
        return [first]
    port = env.get("KVRELAY_METRICS_PORT", "")
    if port not in ("", "0"):
        raise CliError(f"{len(envs)} workers cannot share metrics port {port}: use 0 "
                       "(each binds a free port, named in its heartbeat)")
    return [plan_worker(worker_env, hostname=f"kvrelay-{first.served_model}-{os.getpid()}-"
                        f"{n}@%h") for n, worker_env in enumerate(envs, 1)]


def check_model(model: str) -> None:
    """Fail with one line when ``model`` is neither an installed known model nor a path."""
    require_worker_package("loading a model")
    from kvrelay_worker.loading import (
        is_known_model,
        parse_hub_name,
        registry_model_path,
        unknown_model_error,
    )
    from kvrelay_worker.settings import is_simulated_model

    if is_simulated_model(model):
        return  # the simulated engine (kvrelay_worker/simulated): nothing to load
    try:
        if is_known_model(model):
            registry_model_path(model)
        elif not Path(model).expanduser().exists() and parse_hub_name(model) is None:
            raise unknown_model_error(model)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def needs_preparation(model: str) -> bool:
    """True when ``model`` is a GGUF (known name or file) not yet converted into the cache."""
    from kvrelay_worker.loading import (
        gguf_cache_name,
        is_known_model,
        is_prepared,
        model_cache_dir,
        registry_model_path,
    )

    if is_known_model(model):
        return not is_prepared(model_cache_dir(model), registry_model_path(model))
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return not is_prepared(model_cache_dir(gguf_cache_name(path)), path)
    return False


def prepare(model: str, *, progress: bool = True) -> Path:
    """Convert ``model`` into the cache (a progress bar on stderr); its folder."""
    require_worker_package("preparing a model")
    from kvrelay_worker.loading import prepare_model

    try:
        return prepare_model(model, progress=progress)
    except ValueError as exc:  # UnknownModelError, UnsupportedModelError
        raise CliError(str(exc)) from None


def keeps_gguf_blocks(env: Mapping[str, str]) -> bool:
    """Whether a worker with this environment reads a GGUF's quantized blocks from the file
    (quantization ``gguf``, or ``auto`` on a CPU): it needs no float copy in the cache."""
    from kvrelay_worker.engine.config import EngineConfig  # imports torch
    from kvrelay_worker.engine.engine_model import resolve_quantization
    from kvrelay_worker.engine.errors import EngineConfigError
    from kvrelay_worker.settings import WorkerSettings

    settings = WorkerSettings.from_env(env)
    try:
        config = EngineConfig(device=settings.device, quantization=settings.quantization)
    except EngineConfigError:  # the worker itself will say why it cannot start
        return False
    return resolve_quantization(config, "gguf") == "gguf"


def fetch_if_repository(model: str) -> str:
    """Download a Hub repository (``org/name[@rev][:QUANT]``) into the Hugging Face cache
    now, with a progress bar on a terminal, so the worker finds it there: its local folder
    or ``.gguf`` file; any other ``model`` as it is."""
    from kvrelay_worker.loading import HubSettings, is_known_model, parse_hub_name, resolve_model

    if is_known_model(model) or Path(model).expanduser().exists() or not parse_hub_name(model):
        return model
    hub = HubSettings.from_env()
    where = "the Hugging Face cache alone" if hub.offline else hub.endpoint
    click.echo(f"Fetching {model} from {where} into {hub.cache_dir} ...", err=True)
    try:
        return str(resolve_model(model).path)
    except ValueError as exc:  # HubAccessError, UnknownModelError, UnsupportedModelError
        raise CliError(str(exc)) from None


def prepare_if_needed(model: str, env: Mapping[str, str] | None = None) -> None:
    """Download and convert before the worker starts, so the first start shows a progress
    bar instead of a silent minute inside the worker; no conversion for a worker (``env``)
    that keeps the GGUF quantized."""
    model = fetch_if_repository(model)
    if needs_preparation(model) and not (env is not None and keeps_gguf_blocks(env)):
        prepare(model)
