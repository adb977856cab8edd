"""Which Redis and which model a client command talks to, when the user did not say.

Redis: ``--redis-url`` / ``KVRELAY_REDIS_URL``, else the stack a ``kvrelay up --serve``
recorded, else ``redis://localhost:6379/0``. Model: ``--model``, ``KVRELAY_MODEL_NAME``,
``KVRELAY_MODEL``, the recorded stack's, else the one model live workers serve.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvrelay import BrokerUnavailable, Client, KvrelayError
from kvrelay.cli import stack_file
from kvrelay.cli.config import DEFAULT_MODEL, DEFAULT_REDIS_URL, env_value
from kvrelay.cli.errors import CliError

CONNECT_HINT = "start a stack with `kvrelay up --serve`, or set KVRELAY_REDIS_URL"


def redis_url_for(flag: str | None) -> tuple[str, stack_file.StackRecord | None]:
    """The Redis URL to use, and the stack record it came from (if any)."""
    if flag:
        return flag, None
    record = stack_file.read_live_record()
    if record is not None:
        return record.redis_url, record
    return DEFAULT_REDIS_URL, None


def namespace() -> str:
    """The tenant the CLI's clients use: ``KVRELAY_NAMESPACE`` (empty: the default)."""
    return env_value("NAMESPACE") or ""


@contextmanager
def connected(flag_url: str | None, flag_model: str | None) -> Iterator[tuple[Client, str]]:
    """A client of the Redis to use and the model to ask; an unreachable Redis is one line
    that says how to start a stack."""
    url, record = redis_url_for(flag_url)
    try:
        with Client(url, namespace=namespace()) as client:
            yield client, model_for(flag_model, record, client)
    except BrokerUnavailable as exc:
        raise CliError(f"{exc}; {CONNECT_HINT}") from None


def served_name(model: str) -> str:
    """The name a worker serves ``model`` under (a path serves under its file's name)."""
    path = Path(model).expanduser()
    if path.exists():
        name = path.resolve().name
        return name.removesuffix(".gguf")
    return model


def model_for(flag: str | None, record: stack_file.StackRecord | None, client: Client) -> str:
    if flag:
        return flag
    named = env_value("MODEL_NAME")
    if named:
        return named
    configured = env_value("MODEL")
    if configured:
        return served_name(configured)
    if record is not None:
        return record.model
    served = sorted({worker.model for worker in client.workers()})
    if len(served) > 1:
        raise CliError(f"several models are served ({', '.join(served)}): pass --model")
    return served[0] if served else DEFAULT_MODEL


def unknown_model(client: Client, model: str) -> CliError:
    """The error for a model no live worker serves, saying what is served and what to do."""
    try:
        served = sorted({worker.model for worker in client.workers()})
    except KvrelayError:
        served = []
    listing = ", ".join(served) if served else "none"
    return CliError(
        f"no live worker serves model {model!r} (served: {listing}); start one with "
        f"`kvrelay worker --model {model}` or pick a served model with --model"
    )
