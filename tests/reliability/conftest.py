"""Servers of their own for the reliability tests: TLS, ACL users, small bulk limits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tls_setup import TlsRedis, TlsUnavailable, make_certificates

from kvrelay.cli.errors import CliError


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
