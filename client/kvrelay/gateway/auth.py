"""API key -> tenant, and job ids that say which tenant owns them (no state needed).

A job id is ``<tenant tag>-<random hex>``; the tag is a hash of the tenant's name, so a
gateway can tell whose job an id is without storing anything, and a tenant cannot reach
another's job by resuming or cancelling it.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Mapping

from kvrelay.gateway.errors import GatewayError

# The tenant of every request when no API keys are configured.
OPEN_TENANT = ""


class Authenticator:
    """Maps an ``Authorization: Bearer <key>`` header to a tenant name."""

    def __init__(self, api_keys: Mapping[str, str]) -> None:
        self._by_digest = {_digest(key): tenant for key, tenant in api_keys.items()}

    @property
    def enabled(self) -> bool:
        return bool(self._by_digest)

    def tenant(self, authorization: str | None) -> str:
        """The caller's tenant; raises a 401 ``GatewayError`` for a missing or wrong key."""
        if not self._by_digest:
            return OPEN_TENANT
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise GatewayError(401, "missing API key: send 'Authorization: Bearer <key>'",
                               kind="authentication_error", code="invalid_api_key")
        digest = _digest(key.strip())
        for known, tenant in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                return tenant
        raise GatewayError(401, "invalid API key", kind="authentication_error",
                           code="invalid_api_key")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def tenant_tag(tenant: str) -> str:
    """A short, stable tag of a tenant's name used in its job ids."""
    return hashlib.sha256(b"kvrelay-tenant:" + tenant.encode()).hexdigest()[:12]


def new_job_id(tenant: str) -> str:
    return f"{tenant_tag(tenant)}-{uuid.uuid4().hex}"


def owns(tenant: str, job_id: str) -> bool:
    tag, sep, _ = job_id.partition("-")
    return bool(sep) and hmac.compare_digest(tag, tenant_tag(tenant))


def cache_salt(tenant: str) -> str | None:
    """Prefix-cache entries are shared only within a tenant."""
    return f"tenant:{tenant}" if tenant else None
