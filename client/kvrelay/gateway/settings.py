"""What one gateway process is configured with (flags or ``KVRELAY_*`` variables)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kvrelay.gateway.limits import RequestLimits
from kvrelay.gateway.tenant_policy import TenantPolicies
from kvrelay.keys import Keyspace

# What a tenant may be called (it names a policy and tags its job ids).
_TENANT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _positive(name: str, value: float | None) -> None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class GatewaySettings:
    """Args:
    redis_url: the Redis shared with the workers.
    api_keys: key -> tenant; empty means no keys are asked for.
    namespace: the namespace of tenants not in ``tenant_namespaces`` (and of a gateway
        without keys); empty is the default ``kvrelay:`` one.
    tenant_namespaces: tenant -> namespace: that tenant's jobs go to the workers of its
        own namespace (``KVRELAY_NAMESPACE`` on those workers), and its queues, logs and
        workers are invisible to every other tenant's requests.
    max_queue: a model's queue longer than this answers 429; None for no limit.
    retry_after: seconds a 429 tells the caller to wait (``Retry-After``).
    job_timeout: a job still unfinished after this many seconds answers 504.
    stream_timeout: seconds without any event of a job before it is given up.
    reconnect_timeout: seconds a request waits out an unreachable or refusing Redis
        before it answers 503 (a load balancer in front may rather try another gateway).
    limits: what one HTTP request may cost (``kvrelay.gateway.limits``).
    policies: each tenant's priority ceiling and quotas (``kvrelay.gateway.tenant_policy``).
    admin_key: the bearer key of the admin routes (``/v1/admin/adapters``); empty turns
        them off (403), so no API key alone can load code paths onto workers.
    """

    redis_url: str = "redis://localhost:6379/0"
    api_keys: Mapping[str, str] = field(default_factory=dict)
    namespace: str = ""
    tenant_namespaces: Mapping[str, str] = field(default_factory=dict)
    max_queue: int | None = None
    retry_after: int = 1
    job_timeout: float | None = 600.0
    stream_timeout: float = 60.0
    reconnect_timeout: float = 30.0
    limits: RequestLimits = field(default_factory=RequestLimits)
    policies: TenantPolicies = field(default_factory=TenantPolicies)
    admin_key: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        _positive("job_timeout", self.job_timeout)
        _positive("stream_timeout", self.stream_timeout)
        _positive("reconnect_timeout", self.reconnect_timeout)
        if self.max_queue is not None and self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.retry_after < 0:
            raise ValueError(f"retry_after must be >= 0, got {self.retry_after}")
        for namespace in {self.namespace, *self.tenant_namespaces.values()}:
            Keyspace(namespace)  # raises NamespaceError (a ValueError) for an unsafe one

    def namespace_of(self, tenant: str) -> str:
        return self.tenant_namespaces.get(tenant, self.namespace)

    @property
    def namespaces(self) -> list[str]:
        """Every namespace this gateway sends jobs to (one SDK client each)."""
        return sorted({self.namespace, *self.tenant_namespaces.values()})

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GatewaySettings:
        """Read ``KVRELAY_REDIS_URL``, ``KVRELAY_GATEWAY_API_KEYS`` (``key=tenant,...``),
        ``KVRELAY_GATEWAY_API_KEYS_FILE``, ``KVRELAY_NAMESPACE``,
        ``KVRELAY_GATEWAY_TENANT_NAMESPACES`` (``tenant=namespace,...``),
        ``KVRELAY_GATEWAY_MAX_QUEUE``,
        ``KVRELAY_GATEWAY_JOB_TIMEOUT``, ``KVRELAY_GATEWAY_STREAM_TIMEOUT``,
        ``KVRELAY_GATEWAY_RECONNECT_TIMEOUT`` and ``KVRELAY_GATEWAY_ADMIN_KEY``."""
        environ = os.environ if env is None else env
        keys: dict[str, str] = {}
        path = environ.get("KVRELAY_GATEWAY_API_KEYS_FILE")
        if path:
            keys.update(parse_api_keys(Path(path).read_text(), where=path))
        inline = environ.get("KVRELAY_GATEWAY_API_KEYS")
        if inline:
            keys.update(parse_api_keys(inline.replace(",", "\n"), where="KVRELAY_GATEWAY_API_KEYS"))
        namespaces = parse_pairs(environ.get("KVRELAY_GATEWAY_TENANT_NAMESPACES", "")
                                 .replace(",", "\n"), where="KVRELAY_GATEWAY_TENANT_NAMESPACES",
                                 shape="tenant=namespace")
        max_queue = environ.get("KVRELAY_GATEWAY_MAX_QUEUE")
        job_timeout = environ.get("KVRELAY_GATEWAY_JOB_TIMEOUT")
        return cls(
            redis_url=environ.get("KVRELAY_REDIS_URL", cls.redis_url),
            api_keys=keys,
            namespace=environ.get("KVRELAY_NAMESPACE", ""),
            tenant_namespaces=namespaces,
            max_queue=int(max_queue) if max_queue else None,
            job_timeout=_seconds("KVRELAY_GATEWAY_JOB_TIMEOUT", job_timeout) or cls.job_timeout,
            stream_timeout=_seconds("KVRELAY_GATEWAY_STREAM_TIMEOUT",
                                    environ.get("KVRELAY_GATEWAY_STREAM_TIMEOUT"))
            or cls.stream_timeout,
            reconnect_timeout=_seconds("KVRELAY_GATEWAY_RECONNECT_TIMEOUT",
                                       environ.get("KVRELAY_GATEWAY_RECONNECT_TIMEOUT"))
            or cls.reconnect_timeout,
            admin_key=environ.get("KVRELAY_GATEWAY_ADMIN_KEY", "").strip(),
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
    """One ``key=tenant`` per line, the key taken whole: everything before the line's last
    ``=`` (base64 keys end in ``=`` and secrets may hold ``#``; tenant names hold neither).
    Blank lines and lines starting with ``#`` are skipped; a comment after a key is not
    (it would be read as part of the tenant name, which is refused)."""
    keys: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, tenant = line.rpartition("=")
        key, tenant = key.strip(), tenant.strip()
        if not sep or not key or not tenant:
            raise ValueError(f"{where}:{number}: expected 'key=tenant'")
        if not _TENANT_NAME.fullmatch(tenant):
            raise ValueError(f"{where}:{number}: tenant name {tenant!r} may hold letters, "
                             "digits and '._-' only")
        keys[key] = tenant
    return keys


def parse_pairs(text: str, *, where: str, shape: str) -> dict[str, str]:
    """``left=right`` (or ``left right``) per line; blank lines and ``#`` comments skipped."""
    pairs: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        left, sep, right = line.replace("=", " ", 1).partition(" ")
        left, right = left.strip(), right.strip()
        if not sep or not left or not right:
            raise ValueError(f"{where}:{number}: expected '{shape}'")
        pairs[left] = right
    return pairs
