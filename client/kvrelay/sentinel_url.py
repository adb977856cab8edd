"""The Redis Sentinel URL form, parsed in one place for every side that connects to Redis.

    redis+sentinel://[user:password@]host1[:26379][,host2[:26379]...]/<master-name>[/<db>]
                     [?wait_replicas=1&wait_timeout_ms=200]

The hosts are the sentinels (port 26379 when left out); the credentials and ``db`` are
those of the Redis primary the sentinels name. The SDK, the worker, Celery's broker
connections on both sides, the gateway and the CLI all accept it wherever they accept a
``redis://`` URL, and every connection asks the sentinels for the current primary each
time it connects, so it follows a failover.

Redis replicates asynchronously: a write the primary acknowledged can vanish when a
replica that had not received it is promoted. In sentinel mode every write kvrelay must
not lose (a job message, a job's claim and events, its end) is followed on the same
connection by ``WAIT wait_replicas wait_timeout_ms``, so it is taken as done only once a
replica holds it; a write whose connection dies first is sent again to the new primary
(every one of them is idempotent). ``wait_replicas=0`` turns that off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qs, quote, unquote

__all__ = [
    "DEFAULT_SENTINEL_PORT",
    "SENTINEL_SCHEME",
    "SentinelUrl",
    "SentinelUrlError",
    "is_sentinel_url",
    "kombu_sentinel_settings",
    "parse_sentinel_url",
]

SENTINEL_SCHEME: Final = "redis+sentinel"
_TLS_SCHEME: Final = "rediss+sentinel"
DEFAULT_SENTINEL_PORT: Final = 26379
DEFAULT_WAIT_REPLICAS: Final = 1
DEFAULT_WAIT_TIMEOUT_MS: Final = 200
# kombu passes unknown transport options through untouched: ours carry the WAIT settings
# to the Channel._put wrapper in ``kvrelay.queue_push``.
WAIT_REPLICAS_OPTION: Final = "kvrelay_wait_replicas"
WAIT_TIMEOUT_OPTION: Final = "kvrelay_wait_timeout_ms"

_QUERY_KEYS: Final = ("wait_replicas", "wait_timeout_ms")


class SentinelUrlError(ValueError):
    """A ``redis+sentinel://`` URL that cannot be used; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class SentinelUrl:
    """Where the sentinels are, which primary to ask them for, and how to log in to it."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    wait_replicas: int = DEFAULT_WAIT_REPLICAS
    wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS

    def redacted(self) -> str:
        """The URL without its password, for messages and logs."""
        hosts = ",".join(_host_port(host, port) for host, port in self.sentinels)
        user = ""
        if self.password is not None:
            user = f"{quote(self.username or '', safe='')}:***@"
        elif self.username:
            user = f"{quote(self.username, safe='')}@"
        return f"{SENTINEL_SCHEME}://{user}{hosts}/{self.master_name}/{self.db}"

    def primary_kwargs(self) -> dict[str, Any]:
        """redis-py keyword arguments for connections to the primary."""
        kwargs: dict[str, Any] = {"db": self.db}
        if self.username:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        return kwargs


def is_sentinel_url(url: str) -> bool:
    """A Sentinel URL, or the TLS spelling of one (which ``parse_sentinel_url`` refuses)."""
    return url.lower().startswith((SENTINEL_SCHEME + "://", _TLS_SCHEME + "://"))


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Parse a ``redis+sentinel://`` URL; raises ``SentinelUrlError`` saying what is wrong."""
    if url.lower().startswith(_TLS_SCHEME + "://"):
        raise SentinelUrlError(f"{_TLS_SCHEME}:// (TLS through sentinels) is not supported "
                               f"yet; use {SENTINEL_SCHEME}://")
    if not is_sentinel_url(url):
        raise SentinelUrlError(f"a Sentinel URL starts with {SENTINEL_SCHEME}://")
    rest = url[len(SENTINEL_SCHEME) + 3:]
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise SentinelUrlError("a Sentinel URL has no #fragment")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username: str | None = None
    password: str | None = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = tuple(_parse_host(part) for part in hosts.split(","))
    parts = path.split("/") if slash else []
    if parts and parts[-1] == "":
        parts.pop()  # a trailing slash
    if not parts or not parts[0]:
        raise SentinelUrlError(
            "the Sentinel URL names no primary: write "
            f"{SENTINEL_SCHEME}://host:26379/<master-name>[/<db>]")
    if len(parts) > 2:
        raise SentinelUrlError(f"the Sentinel URL's path is /<master-name>[/<db>], got /{path}")
    master_name = unquote(parts[0])
    db = _non_negative("db", parts[1]) if len(parts) == 2 else 0
    options = _parse_query(query)
    return SentinelUrl(
        sentinels=sentinels, master_name=master_name, db=db, username=username,
        password=password,
        wait_replicas=options.get("wait_replicas", DEFAULT_WAIT_REPLICAS),
        wait_timeout_ms=options.get("wait_timeout_ms", DEFAULT_WAIT_TIMEOUT_MS),
    )


def kombu_sentinel_settings(target: SentinelUrl) -> tuple[str, dict[str, Any]]:
    """kombu's spelling of ``target``: its broker URL (one ``sentinel://`` per sentinel,
    ``;``-separated) and the transport options it needs beside it."""
    auth = ""
    if target.username or target.password is not None:
        auth = quote(target.username or "", safe="")
        if target.password is not None:
            auth += ":" + quote(target.password, safe="")
        auth += "@"
    url = ";".join(f"sentinel://{auth}{_host_port(host, port)}/{target.db}"
                   for host, port in target.sentinels)
    options: dict[str, Any] = {
        "master_name": target.master_name,
        WAIT_REPLICAS_OPTION: target.wait_replicas,
        WAIT_TIMEOUT_OPTION: target.wait_timeout_ms,
    }
    return url, options


def _parse_host(part: str) -> tuple[str, int]:
    if not part:
        raise SentinelUrlError("the Sentinel URL lists an empty sentinel address "
                               "(write host1:26379,host2:26379)")
    if part.startswith("["):  # [IPv6]:port
        host, bracket, tail = part[1:].partition("]")
        if not bracket or not host:
            raise SentinelUrlError(f"bad IPv6 sentinel address {part!r}")
        if tail and not tail.startswith(":"):
            raise SentinelUrlError(f"bad sentinel address {part!r}")
        port_text = tail[1:] if tail else ""
    else:
        host, _, port_text = part.partition(":")
        if not host:
            raise SentinelUrlError(f"the sentinel address {part!r} has no host")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    port = _non_negative("port", port_text)
    if not 0 < port < 65536:
        raise SentinelUrlError(f"sentinel port must be 1-65535, got {port_text!r}")
    return host, port


def _parse_query(query: str) -> dict[str, int]:
    options: dict[str, int] = {}
    try:
        pairs = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise SentinelUrlError(f"the Sentinel URL's query {query!r} is not name=value pairs") \
            from None
    for name, values in pairs.items():
        if name not in _QUERY_KEYS:
            raise SentinelUrlError(
                f"unknown Sentinel URL option {name!r} (known: {', '.join(_QUERY_KEYS)})")
        options[name] = _non_negative(name, values[-1])
    return options


def _non_negative(what: str, text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise SentinelUrlError(f"the Sentinel URL's {what} must be a whole number >= 0, "
                               f"got {text!r}")
    return int(text)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
