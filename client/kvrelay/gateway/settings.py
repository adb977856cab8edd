"""What one gateway process is configured with (flags or ``KVRELAY_*`` variables)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


def _positive(name: str, value: float | None) -> None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class GatewaySettings:
    """Args:
    redis_url: the Redis shared with the workers.
    api_keys: key -> tenant; empty means no keys are asked for.
    max_queue: a model's queue longer than this answers 429; None for no limit.
    retry_after: seconds a 429 tells the caller to wait (``Retry-After``).
    job_timeout: a job still unfinished after this many seconds answers 504.
    stream_timeout: seconds without any event of a job before it is given up.
    """

    redis_url: str = "redis://localhost:6379/0"
    api_keys: Mapping[str, str] = field(default_factory=dict)
    max_queue: int | None = None
    retry_after: int = 1
    job_timeout: float | None = 600.0
    stream_timeout: float = 60.0

    def __post_init__(self) -> None:
        _positive("job_timeout", self.job_timeout)
        _positive("stream_timeout", self.stream_timeout)
        if self.max_queue is not None and self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.retry_after < 0:
            raise ValueError(f"retry_after must be >= 0, got {self.retry_after}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GatewaySettings:
        """Read ``KVRELAY_REDIS_URL``, ``KVRELAY_GATEWAY_API_KEYS`` (``key=tenant,...``),
        ``KVRELAY_GATEWAY_API_KEYS_FILE``, ``KVRELAY_GATEWAY_MAX_QUEUE``,
        ``KVRELAY_GATEWAY_JOB_TIMEOUT`` and ``KVRELAY_GATEWAY_STREAM_TIMEOUT``."""
        environ = os.environ if env is None else env
        keys: dict[str, str] = {}
        path = environ.get("KVRELAY_GATEWAY_API_KEYS_FILE")
        if path:
            keys.update(parse_api_keys(Path(path).read_text(), where=path))
        inline = environ.get("KVRELAY_GATEWAY_API_KEYS")
        if inline:
            keys.update(parse_api_keys(inline.replace(",", "\n"), where="KVRELAY_GATEWAY_API_KEYS"))
        max_queue = environ.get("KVRELAY_GATEWAY_MAX_QUEUE")
        job_timeout = environ.get("KVRELAY_GATEWAY_JOB_TIMEOUT")
        return cls(
            redis_url=environ.get("KVRELAY_REDIS_URL", cls.redis_url),
            api_keys=keys,
            max_queue=int(max_queue) if max_queue else None,
            job_timeout=_seconds("KVRELAY_GATEWAY_JOB_TIMEOUT", job_timeout) or cls.job_timeout,
            stream_timeout=_seconds("KVRELAY_GATEWAY_STREAM_TIMEOUT",
                                    environ.get("KVRELAY_GATEWAY_STREAM_TIMEOUT"))
            or cls.stream_timeout,
        )


def _seconds(name: str, text: str | None) -> float | None:
    """A positive, finite number of seconds from a variable (NaN or inf would never time
    out); None when the variable is unset."""
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {text!r}")
    return value


def parse_api_keys(text: str, *, where: str) -> dict[str, str]:
    """``key=tenant`` (or ``key tenant``) per line; blank lines and ``#`` comments skipped."""
    keys: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, tenant = line.replace("=", " ", 1).partition(" ")
        key, tenant = key.strip(), tenant.strip()
        if not sep or not key or not tenant:
            raise ValueError(f"{where}:{number}: expected 'key=tenant'")
        keys[key] = tenant
    return keys
