"""TLS for Celery's broker connections, verified exactly as redis-py verifies the others.

With a ``rediss://`` URL redis-py (our command and pub/sub connections) checks the
server's certificate and host name, but kombu, left to itself, connects with
``CERT_NONE`` after a warning: the one connection that carries every prompt would
trust any server. ``celery_ssl_options`` turns the URL into kombu's ``broker_use_ssl``
so both sides read the same settings from the same place, the URL's query:

- ``ssl_ca_certs=/path/ca.pem``: the CA to trust (default: the system's store, which
  also honours ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``);
- ``ssl_certfile`` / ``ssl_keyfile``: a client certificate, when the server asks for one;
- ``ssl_cert_reqs=none``: the explicit opt-out for self-signed test setups (no
  certificate or host-name check, on every connection). ``required`` is the default.
"""

from __future__ import annotations

import ssl
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

__all__ = ["TlsConfigError", "celery_ssl_options"]

_CERT_REQS: Final = {
    "required": ssl.CERT_REQUIRED,
    "cert_required": ssl.CERT_REQUIRED,
    "optional": ssl.CERT_OPTIONAL,
    "cert_optional": ssl.CERT_OPTIONAL,
    "none": ssl.CERT_NONE,
    "cert_none": ssl.CERT_NONE,
}
_PATHS: Final = ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile")


class TlsConfigError(ValueError):
    """A ``rediss://`` URL whose TLS settings cannot be used."""


def celery_ssl_options(url: str) -> dict[str, Any] | None:
    """kombu's ``broker_use_ssl`` for ``url``; None when ``url`` is not ``rediss://``."""
    parts = urlsplit(url)
    if parts.scheme != "rediss":
        return None
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    raw = query.get("ssl_cert_reqs", "required")
    reqs = _CERT_REQS.get(raw.strip().lower())
    if reqs is None:
        raise TlsConfigError(
            f"ssl_cert_reqs must be one of required, optional, none; got {raw!r}"
        )
    options: dict[str, Any] = {"ssl_cert_reqs": reqs}
    options.update({name: query[name] for name in _PATHS if query.get(name)})
    # The opt-out turns the host-name check off too (it needs a verified certificate).
    options["ssl_check_hostname"] = reqs != ssl.CERT_NONE
    return options
