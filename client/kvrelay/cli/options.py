"""Option groups shared by several commands, each naming the variable it overrides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
import msgspec

from kvrelay.cli.finite_float import FiniteFloatRange
from kvrelay.protocol import DEFAULT_MAX_TOKENS, SamplingOptions

F = TypeVar("F", bound=Callable[..., Any])

DEVICE_HELP = "auto (CUDA when present, else CPU), cpu, cuda or cuda:N."


def _apply(func: F, decorators: list[Callable[[F], F]]) -> F:
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def redis_url_option(help_text: str) -> Callable[[F], F]:
    return click.option(
        "--redis-url", envvar="KVRELAY_REDIS_URL", show_envvar=True, metavar="URL", help=help_text
    )


def worker_options(func: F) -> F:
    """What to load and how: shared by ``kvrelay worker`` and ``kvrelay up``."""
    return _apply(
        func,
        [
            click.option(
                "--model",
                envvar="KVRELAY_MODEL",
                show_envvar=True,
                metavar="NAME|PATH",
                help="A known model name, a Hugging Face folder or a .gguf file "
                "[default: smollm2-135m-instruct].",
            ),
            click.option(
                "--model-name",
                envvar="KVRELAY_MODEL_NAME",
                show_envvar=True,
                metavar="NAME",
                help="The name clients ask for [default: the model's].",
            ),
            click.option(
                "--device",
                envvar="KVRELAY_DEVICE",
                show_envvar=True,
                metavar="DEVICE",
                help=DEVICE_HELP,
            ),
            click.option(
                "--dtype",
                envvar="KVRELAY_DTYPE",
                show_envvar=True,
                type=click.Choice(["auto", "float32", "float16", "bfloat16"]),
                help="Weights and activations dtype [default: auto].",
            ),
            click.option(
                "--concurrency",
                envvar="KVRELAY_CONCURRENCY",
                show_envvar=True,
                type=click.IntRange(min=1),
                metavar="N",
                help="Jobs held at once (Celery threads) [default: 64].",
            ),
            click.option(
                "--max-model-len",
                envvar="KVRELAY_MAX_MODEL_LEN",
                show_envvar=True,
                type=click.IntRange(min=1),
                metavar="TOKENS",
                help="Longest prompt plus output [default: the model's].",
            ),
            click.option(
                "--metrics-port",
                envvar="KVRELAY_METRICS_PORT",
                show_envvar=True,
                type=click.IntRange(0, 65535),
                metavar="PORT",
                help="Serve Prometheus metrics on this port.",
            ),
        ],
    )


def client_options(func: F) -> F:
    """Where to send jobs: shared by ``generate`` and ``chat``."""
    return _apply(
        func,
        [
            click.option(
                "--model",
                metavar="NAME",
                help="Model to ask [default: KVRELAY_MODEL_NAME, KVRELAY_MODEL, the "
                "running stack's, or the only one served].",
            ),
            redis_url_option(
                "Redis of the workers [default: the running `kvrelay up --serve` "
                "stack, else redis://localhost:6379/0]."
            ),
            click.option(
                "--stream-timeout",
                envvar="KVRELAY_STREAM_TIMEOUT",
                show_envvar=True,
                type=FiniteFloatRange(min=0, min_open=True),
                default=120.0,
                show_default=True,
                metavar="SECONDS",
                help="Fail if no token arrives for this long.",
            ),
        ],
    )


def sampling_range(field: str) -> click.ParamType:
    """A sampling option's click type, with the bounds ``kvrelay.protocol`` gives it."""
    struct = msgspec.inspect.type_info(SamplingOptions)
    assert isinstance(struct, msgspec.inspect.StructType)
    info = next(f.type for f in struct.fields if f.name == field)
    if isinstance(info, msgspec.inspect.UnionType):  # "or None": the flag may be left out
        info = next(t for t in info.types if not isinstance(t, msgspec.inspect.NoneType))
    if isinstance(info, msgspec.inspect.IntType):
        low = info.ge if info.gt is None else info.gt + 1
        high = info.le if info.lt is None else info.lt - 1
        return click.IntRange(low, high)
    assert isinstance(info, msgspec.inspect.FloatType), info
    return FiniteFloatRange(
        info.ge if info.gt is None else info.gt,
        info.le if info.lt is None else info.lt,
        min_open=info.gt is not None,
        max_open=info.lt is not None,
    )


def sampling_options(temperature: float) -> Callable[[F], F]:
    """Generation options shared by ``up``, ``generate`` and ``chat``."""

    def decorate(func: F) -> F:
        return _apply(
            func,
            [
                click.option(
                    "--max-tokens",
                    type=sampling_range("max_tokens"),
                    default=DEFAULT_MAX_TOKENS,
                    show_default=True,
                    help="Most tokens to generate.",
                ),
                click.option(
                    "--temperature",
                    type=sampling_range("temperature"),
                    default=temperature,
                    show_default=True,
                    help="Sampling temperature (0: greedy).",
                ),
                click.option(
                    "--top-p",
                    type=sampling_range("top_p"),
                    default=1.0,
                    show_default=True,
                    help="Nucleus sampling mass.",
                ),
                click.option(
                    "--seed",
                    type=sampling_range("seed"),
                    default=None,
                    help="Seed for reproducible sampling.",
                ),
                click.option(
                    "--system",
                    metavar="TEXT",
                    default=None,
                    help="A system message before the conversation.",
                ),
            ],
        )

    return decorate
