"""A certificate authority made for one test, and a ``redis-server`` speaking only TLS.

Certificates come from the ``openssl`` command line (no extra Python dependency); the
server is the ``redis-server`` on PATH, which must be built with TLS. Whatever is
missing makes the caller skip with the reason, never fail.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import redis

from kvrelay.cli.redis_server import PrivateRedis, find_redis_server, free_port


class TlsUnavailable(Exception):
    """This machine cannot run the TLS tests (the message says why)."""


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, timeout=60)
    if result.returncode != 0:
        raise TlsUnavailable(f"openssl {args[0]} failed: {result.stderr.decode()[-300:]}")


def make_certificates(folder: Path) -> Certificates:
    """A fresh CA, and a server certificate it signs for 127.0.0.1 and localhost."""
    if shutil.which("openssl") is None:
        raise TlsUnavailable("the openssl command is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=kvrelay test CA", "-keyout", "ca.key", "-out", "ca.crt", cwd=folder)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", "server.key", "-out", "server.csr", cwd=folder)
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.crt",
             cwd=folder)
    return Certificates(folder / "ca.crt", folder / "server.crt", folder / "server.key")


class TlsRedis(PrivateRedis):
    """A private ``redis-server`` with the plain port off and a TLS port on."""

    def __init__(self, workdir: Path, certs: Certificates) -> None:
        binary = find_redis_server()
        if binary is None:
            raise TlsUnavailable("no redis-server is installed")
        port = free_port()
        super().__init__(workdir, port=0, extra_args=(
            "--tls-port", str(port), "--port", "0",
            "--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key),
            "--tls-ca-cert-file", str(certs.ca), "--tls-auth-clients", "no",
        ))
        self.tls_port = port
        self.certs = certs

    def probe_client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, ssl_ca_certs=str(self.certs.ca),
                                    socket_connect_timeout=0.5)

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.tls_port}/0"
