"""What one tenant may ask of the shared workers: a priority ceiling, jobs at once, jobs
waiting, requests per second. Enforced by the gateway; the counting is in Redis
(``kvrelay.tenant_quota``), so every gateway process of a namespace shares it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from kvrelay.tenant_quota import TenantQuota

# The table of a config file that applies to every tenant not named in one of its own.
DEFAULT_TABLE = "default"
# The name a gateway without API keys counts its one (anonymous) tenant under.
OPEN_TENANT_NAME = "default"


@dataclass(frozen=True)
class TenantPolicy:
    """Args:
    max_priority: a request's ``priority`` is lowered to this (never refused): the
        engine runs higher priorities first and preempts lower ones for them, so the
        ceiling is what stops one tenant from pushing everyone else's jobs aside.
    max_jobs: the tenant's jobs admitted and not yet ended (queued or running), at most;
        None: no limit. Past it: 429.
    max_queued: the tenant's jobs admitted and not yet started by a worker, at most;
        None: no limit. Past it: 429.
    requests_per_second: admitted jobs per second, sustained (a token bucket holding
        ``burst`` tokens); None: no limit. Past it: 429.
    burst: jobs the bucket lets through at once (default: one second's worth, at least 1).
    """

    max_priority: int = 0
    max_jobs: int | None = None
    max_queued: int | None = None
    requests_per_second: float | None = None
    burst: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_jobs", "max_queued", "burst"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if isinstance(self.max_priority, bool) or not isinstance(self.max_priority, int):
            raise ValueError(f"max_priority must be a whole number, got {self.max_priority!r}")
        rate = self.requests_per_second
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                                 or not math.isfinite(rate) or rate <= 0):
            raise ValueError(f"requests_per_second must be a number > 0, got {rate!r}")

    @property
    def bucket_size(self) -> int:
        if self.burst is not None:
            return self.burst
        return max(1, math.ceil(self.requests_per_second or 1))

    @property
    def counts_jobs(self) -> bool:
        """Whether admission must count this tenant's jobs (a limit is set)."""
        return (self.max_jobs is not None or self.max_queued is not None
                or self.requests_per_second is not None)

    def clamp(self, priority: int | None) -> int | None:
        if priority is None or priority <= self.max_priority:
            return priority
        return self.max_priority

    @classmethod
    def from_table(cls, where: str, table: Mapping[str, Any],
                   base: TenantPolicy | None = None) -> TenantPolicy:
        """A ``[tenants.NAME]`` table; names it leaves out keep ``base``'s values."""
        known = [item.name for item in fields(cls)]
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise ValueError(f"[{where}]: unknown setting(s) {', '.join(unknown)}; "
                             f"known: {', '.join(known)}")
        values = {name: getattr(base or cls(), name) for name in known}
        values.update(table)
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"[{where}]: {exc}") from None


@dataclass(frozen=True)
class TenantPolicies:
    """Every tenant's policy: its own table, else the default one."""

    default: TenantPolicy = TenantPolicy()
    tenants: Mapping[str, TenantPolicy] | None = None

    def of(self, tenant: str) -> TenantPolicy:
        return (self.tenants or {}).get(tenant, self.default)


def quota_of(tenant: str, policy: TenantPolicy) -> TenantQuota:
    """The SDK's ``TenantQuota`` for ``tenant`` under ``policy``."""
    return TenantQuota(tenant=tenant or OPEN_TENANT_NAME, max_jobs=policy.max_jobs,
                       max_queued=policy.max_queued,
                       requests_per_second=policy.requests_per_second,
                       burst=policy.bucket_size)
