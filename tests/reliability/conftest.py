"""Servers of their own for the reliability tests: TLS, ACL users, small bulk limits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers.refusing_redis import ReplicatedPrimary
from helpers.sentinel_cluster import SentinelCluster
from tls_setup import TlsRedis, TlsUnavailable, make_certificates

from kvrelay.acl import tenant_acl_rules
from kvrelay.cli.errors import CliError
from kvrelay.cli.redis_server import PrivateRedis
from kvrelay.keys import Keyspace
from kvrelay.lua_library import LIBRARY
from kvrelay.redis_functions import Functions

TENANTS = ("alpha", "beta")


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """A TLS-only redis-server whose certificate a CA made for this module signed.

    Skipped, with the reason, where openssl is missing or redis-server lacks TLS.
    """
    folder: Path = tmp_path_factory.mktemp("tls")
    try:
        server = TlsRedis(folder / "redis", make_certificates(folder / "certs"))
        server.start()
    except TlsUnavailable as exc:
        pytest.skip(f"TLS tests need openssl and a TLS-enabled redis-server: {exc}")
    except CliError as exc:
        pytest.skip(f"the installed redis-server does not start with TLS "
                    f"(built without it?): {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A redis-server with one ACL user per tenant, made from ``tenant_acl_rules``, and
    kvrelay's functions loaded by the admin (a tenant's user may not load them).

    Yields the admin URL (the default user) and each tenant's URL (its user, its password).
    """
    server = PrivateRedis(tmp_path_factory.mktemp("acl-redis")).start()
    admin = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        urls = {}
        for tenant in TENANTS:
            admin.execute_command("ACL", "SETUSER", tenant, "reset", "on", f">{tenant}-secret",
                                  *tenant_acl_rules(Keyspace(tenant)))
            urls[tenant] = f"redis://{tenant}:{tenant}-secret@127.0.0.1:{server.port}/0"
        Functions(admin, LIBRARY).load()
        yield f"redis://127.0.0.1:{server.port}/0", urls
    finally:
        admin.close()
        server.stop()


@pytest.fixture(scope="module")
def module_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelCluster]:
    """A primary, its replica and three sentinels shared by one module's tests."""
    cluster = SentinelCluster(tmp_path_factory.mktemp("ha")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def own_sentinels(tmp_path: Path) -> Iterator[SentinelCluster]:
    """A primary, its replica and three sentinels of one test's own: for a test that
    fails the primary over, or leaves it paused or demoted."""
    cluster = SentinelCluster(tmp_path).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[ReplicatedPrimary]:
    """A primary under ``min-replicas-to-write 1`` with its replica, refusing on demand."""
    server = ReplicatedPrimary(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()
