"""The gateway's config file (``kvrelay gateway --config FILE``, TOML): ``[limits]`` and
``[tenants.default]`` / ``[tenants.NAME]`` tables; docs/gateway.md shows one whole."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvrelay.gateway.limits import RequestLimits
from kvrelay.gateway.tenant_policy import DEFAULT_TABLE, TenantPolicies, TenantPolicy


@dataclass(frozen=True)
class GatewayConfig:
    limits: RequestLimits
    policies: TenantPolicies


def load_config(path: str | Path) -> GatewayConfig:
    """Read and check the whole file; a mistake raises ``ValueError`` naming its table."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return parse_config(data, where=str(path))


def parse_config(data: dict[str, Any], *, where: str) -> GatewayConfig:
    unknown = sorted(set(data) - {"limits", "tenants"})
    if unknown:
        raise ValueError(f"{where}: unknown table(s) {', '.join(unknown)}; "
                         "known: limits, tenants")
    limits = RequestLimits.from_table(_table(data, "limits", where))
    tenants = _table(data, "tenants", where)
    default = TenantPolicy.from_table("tenants.default",
                                      _table(tenants, DEFAULT_TABLE, where))
    own = {name: TenantPolicy.from_table(f"tenants.{name}", _table(tenants, name, where),
                                         base=default)
           for name in tenants if name != DEFAULT_TABLE}
    return GatewayConfig(limits, TenantPolicies(default, own))


def _table(data: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {name} must be a table")
    return value
