"""Every ``KVRELAY_*`` environment variable in one table, and their validation at start.

The table is the single source for ``kvrelay env`` and the README's configuration table
(a test keeps it equal to the worker's ``WorkerSettings`` fields and to the docs). The
CLI checks the syntax of every variable that is set before a command runs, so a typo in
a number is reported as one line naming the variable, not as a failure deep in a worker.
"""

from __future__ import annotations

import difflib
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final, Literal

from kvrelay.cli.errors import CliError
from kvrelay.connection import DEFAULT_REDIS_URL as DEFAULT_REDIS_URL
from kvrelay.keys import NAMESPACE_PATTERN
from kvrelay.sentinel_url import SentinelUrlError, is_sentinel_url, parse_sentinel_url

Kind = Literal["url", "str", "path", "int", "float", "bool", "choice", "port", "namespace"]
# Who reads a variable: the SDK (``kvrelay`` without the CLI), the ``kvrelay`` command,
# worker processes, ``compose.yaml`` (on the host running ``docker compose``), the tests.
USERS: Final = ("SDK", "CLI", "gateway", "worker", "compose", "tests")

PREFIX: Final = "KVRELAY_"
DEFAULT_MODEL: Final = "smollm2-135m-instruct"


@dataclass(frozen=True)
class Variable:
    """One ``KVRELAY_*`` variable: how to check it and what to say about it."""

    name: str
    kind: Kind
    default: str
    meaning: str
    # Space-separated names from ``USERS``.
    users: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    # The value must be strictly greater than ``minimum`` (e.g. a timeout > 0).
    exclusive: bool = False


# Every dtype name the engine accepts (the short ones too), for the variable and --dtype.
DTYPES: Final = ("auto", "float32", "float16", "bfloat16", "fp32", "fp16", "bf16")

# Constants of the code that the table names instead of repeating them.
_TABLE_CONSTANTS: Final = {"default_redis_url": DEFAULT_REDIS_URL, "default_model": DEFAULT_MODEL}


def _variable(entry: dict[str, Any]) -> Variable:
    name = entry["name"]
    users = entry["users"]
    if not set(users.split()) <= set(USERS):
        raise ValueError(f"{name}: readers must be among {USERS}, got {users!r}")
    choices = entry.get("choices", ())
    minimum = entry.get("minimum")
    return Variable(
        name=f"{PREFIX}{name}",
        kind=entry["kind"],
        default=entry["default"].format(**_TABLE_CONSTANTS),
        meaning=entry["meaning"],
        users=users,
        choices=DTYPES if choices == "dtypes" else tuple(choices),
        minimum=None if minimum is None else float(minimum),
        exclusive=entry.get("exclusive", False),
    )


def _load_table() -> tuple[Variable, ...]:
    """The table is data (``variables.toml`` beside this module): it reads as the README
    table it produces, and each row is one entry rather than one more call."""
    text = resources.files("kvrelay.cli").joinpath("variables.toml").read_text(encoding="utf-8")
    return tuple(_variable(entry) for entry in tomllib.loads(text)["variable"])


VARIABLES: Final[tuple[Variable, ...]] = _load_table()

BY_NAME: Final = {variable.name: variable for variable in VARIABLES}

# Prefixes of variables that are not kvrelay's own settings (never warned about).
_FOREIGN_PREFIXES: Final = ("KVRELAY_TEST_",)

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def check_value(variable: Variable, raw: str) -> str | None:
    """Why ``raw`` is not a valid value of ``variable``, or None when it is."""
    value = raw.strip()
    name = variable.name
    if variable.kind == "url":
        if is_sentinel_url(value):
            try:
                parse_sentinel_url(value)
            except SentinelUrlError as exc:
                return f"{name}: {exc}"
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            return (f"{name} must be a redis://, rediss://, unix:// or redis+sentinel:// URL, "
                    f"got {raw!r}")
        return None
    if variable.kind == "namespace":
        if NAMESPACE_PATTERN.fullmatch(value) is None:
            return f"{name} must be 1-64 letters, digits, '-' or '_', got {raw!r}"
        return None
    if variable.kind == "bool":
        if value.lower() not in _TRUE + _FALSE:
            return f"{name} must be true or false, got {raw!r}"
        return None
    if variable.kind == "choice":
        if value.lower() not in variable.choices:
            return f"{name} must be one of {', '.join(variable.choices)}, got {raw!r}"
        return None
    if variable.kind in ("int", "port", "float"):
        return _check_number(variable, value, raw)
    return None


def _check_number(variable: Variable, value: str, raw: str) -> str | None:
    name = variable.name
    try:
        number: float = float(value) if variable.kind == "float" else int(value)
    except ValueError:
        kind = "a number" if variable.kind == "float" else "an integer"
        return f"{name} must be {kind}, got {raw!r}"
    if not math.isfinite(number):  # nan passes every bound below, inf means "never"
        return f"{name} must be a finite number, got {raw!r}"
    if variable.kind == "port" and not 0 <= number <= 65535:
        return f"{name} must be a port number (0-65535), got {raw!r}"
    low = variable.minimum
    if low is not None and (number <= low if variable.exclusive else number < low):
        bound = f"greater than {low:g}" if variable.exclusive else f"at least {low:g}"
        return f"{name} must be {bound}, got {raw!r}"
    return None


def validate_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """Raise ``CliError`` for the first malformed ``KVRELAY_*`` value; return warnings
    about unknown ``KVRELAY_*`` names (likely typos)."""
    env = os.environ if environ is None else environ
    warnings: list[str] = []
    for name in sorted(env):
        if not name.startswith(PREFIX):
            continue
        variable = BY_NAME.get(name)
        if variable is None:
            if not name.startswith(_FOREIGN_PREFIXES):
                warnings.append(_unknown_variable(name))
            continue
        raw = env[name]
        if raw == "":
            continue  # empty means unset, as the worker reads it
        problem = check_value(variable, raw)
        if problem is not None:
            raise CliError(problem)
    return warnings


def _unknown_variable(name: str) -> str:
    close = difflib.get_close_matches(name, list(BY_NAME), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown variable {name} is ignored{hint}"


def env_value(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of ``KVRELAY_<name>`` (None when unset or empty)."""
    env = os.environ if environ is None else environ
    value = env.get(f"{PREFIX}{name}", "")
    return value or None


def env_float(name: str, default: float) -> float:
    """A validated float variable (``validate_environment`` ran at start)."""
    value = env_value(name)
    return float(value) if value is not None else default
