"""Option groups shared by several commands, each naming the variable it overrides."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click
import msgspec

from kvrelay.cli.config import DTYPES, PREFIX
from kvrelay.cli.finite_float import FiniteFloatRange
from kvrelay.cli.response_format import response_format_flags
from kvrelay.protocol import DEFAULT_MAX_TOKENS, SamplingOptions

F = TypeVar("F", bound=Callable[..., Any])

DEVICE_HELP = "auto (CUDA when present, else CPU), cpu, cuda or cuda:N."

# The flags of ``worker_options``: each becomes the worker setting of the same name.
WORKER_SETTING_FLAGS = (
    "model",
    "model_name",
    "device",
    "dtype",
    "concurrency",
    "max_model_len",
    "metrics_port",
)
# The flags of ``sampling_options`` that are ``client.stream`` keywords of the same name.
SAMPLING_FLAGS = ("max_tokens", "temperature", "top_p", "seed", "best_of", "beam_width",
                  "length_penalty", "early_stopping", "speculative")


def _apply(func: F, decorators: list[Callable[[F], F]]) -> F:
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def env_option(flag: str, variable: str, **kwargs: Any) -> Callable[[F], F]:
    """``--flag`` that falls back to ``KVRELAY_<variable>`` (shown in ``--help``)."""
    return click.option(flag, envvar=f"{PREFIX}{variable}", show_envvar=True, **kwargs)


def picked(params: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The values of ``names`` among a command's parameters."""
    return {name: params[name] for name in names}


def _count_option(flag: str, variable: str, metavar: str, help_text: str) -> Callable[[F], F]:
    """A whole number of at least one, overridable by its variable."""
    return env_option(flag, variable, type=click.IntRange(min=1), metavar=metavar, help=help_text)


def redis_url_option(help_text: str) -> Callable[[F], F]:
    return env_option("--redis-url", "REDIS_URL", metavar="URL", help=help_text)


def worker_options(func: F) -> F:
    """What to load and how: shared by ``kvrelay worker`` and ``kvrelay up``."""
    return _apply(
        func,
        [
            env_option(
                "--model",
                "MODEL",
                metavar="NAME|PATH",
                help="A known model name, a Hugging Face folder, a .gguf file or a Hugging "
                "Face Hub repository org/name[@revision][:QUANT] (downloaded into the "
                "Hugging Face cache) [default: smollm2-135m-instruct].",
            ),
            env_option(
                "--model-name",
                "MODEL_NAME",
                metavar="NAME",
                help="The name clients ask for [default: the model's; org/name for a "
                "repository].",
            ),
            env_option("--device", "DEVICE", metavar="DEVICE", help=DEVICE_HELP),
            env_option(
                "--dtype",
                "DTYPE",
                type=click.Choice(DTYPES, case_sensitive=False),
                help="Weights and activations dtype [default: auto].",
            ),
            _count_option(
                "--concurrency",
                "CONCURRENCY",
                "N",
                "Jobs held at once (Celery threads) [default: 64].",
            ),
            _count_option(
                "--max-model-len",
                "MAX_MODEL_LEN",
                "TOKENS",
                "Longest prompt plus output [default: the model's].",
            ),
            env_option(
                "--metrics-port",
                "METRICS_PORT",
                type=click.IntRange(0, 65535),
                metavar="PORT",
                help="Serve Prometheus metrics on this port (0: any free one, logged).",
            ),
        ],
    )


def seconds_option(flag: str, variable: str, default: float, help_text: str) -> Callable[[F], F]:
    """A positive number of seconds with a default, overridable by its variable."""
    return env_option(
        flag,
        variable,
        type=FiniteFloatRange(min=0, min_open=True),
        default=default,
        show_default=True,
        metavar="SECONDS",
        help=help_text,
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
            seconds_option(
                "--stream-timeout",
                "STREAM_TIMEOUT",
                120.0,
                "Fail if no token arrives for this long.",
            ),
            click.option(
                "--json",
                "as_json",
                is_flag=True,
                help="Print each answer as one JSON object (text, token ids, finish reason, "
                "usage, timings, worker) once it is complete, instead of streaming it.",
            ),
            click.option(
                "--timeout",
                type=FiniteFloatRange(min=0, min_open=True),
                metavar="SECONDS",
                help="Fail a job that has not finished after this long.",
            ),
            click.option(
                "--lora",
                metavar="NAME",
                help="Run with this LoRA adapter of the model (`kvrelay adapters list`).",
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


def _early_stopping(_ctx: click.Context, _param: click.Parameter, value: str | None
                    ) -> bool | str | None:
    """The wire's form: true/false as booleans, "never" as is."""
    return None if value is None else {"true": True, "false": False}.get(value, value)


def _sampling_flag(flag: str, default: float, help_text: str) -> Callable[[F], F]:
    """``--flag`` for the sampling field of the same name, its bounds from the wire struct."""
    kind = sampling_range(flag.removeprefix("--").replace("-", "_"))
    return click.option(flag, type=kind, default=default, show_default=True, help=help_text)


def sampling_options(temperature: float) -> Callable[[F], F]:
    """Generation options shared by ``up``, ``generate`` and ``chat``."""

    def decorate(func: F) -> F:
        return _apply(
            func,
            [
                _sampling_flag("--max-tokens", DEFAULT_MAX_TOKENS, "Most tokens to generate."),
                _sampling_flag("--temperature", temperature, "Sampling temperature (0: greedy)."),
                _sampling_flag("--top-p", 1.0, "Nucleus sampling mass."),
                click.option(
                    "--seed",
                    type=sampling_range("seed"),
                    default=None,
                    help="Seed for reproducible sampling.",
                ),
                click.option(
                    "--best-of",
                    type=sampling_range("best_of"),
                    default=None,
                    metavar="N",
                    help="Sample N answers and show the most likely one (printed whole, "
                    "once all N are done).",
                ),
                click.option(
                    "--beam-width",
                    type=sampling_range("beam_width"),
                    default=None,
                    metavar="K",
                    help="Beam search with K beams (greedy; sampling flags are ignored); "
                    "the best beam is printed whole once the search ends.",
                ),
                click.option(
                    "--length-penalty",
                    type=sampling_range("length_penalty"),
                    default=None,
                    help="Beam search: scores are divided by length ** this (default 1).",
                ),
                click.option(
                    "--early-stopping",
                    type=click.Choice(["true", "false", "never"]),
                    default=None,
                    callback=_early_stopping,
                    help="Beam search: stop when K beams are done (true), when no beam "
                    "can do better (false, the default), or never before max tokens.",
                ),
                click.option(
                    "--speculative/--no-speculative",
                    default=None,
                    help="--no-speculative: decode without speculation, even on a worker "
                    "that speculates (KVRELAY_SPECULATIVE) [default: the worker's setting].",
                ),
                click.option(
                    "--system",
                    metavar="TEXT",
                    default=None,
                    help="A system message before the conversation.",
                ),
                *response_format_flags(),
            ],
        )

    return decorate
