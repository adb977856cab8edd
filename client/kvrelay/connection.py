"""Building the command connection and turning redis errors into ``kvrelay.BrokerUnavailable``.

Callers catch ``kvrelay.BrokerUnavailable`` (also a builtin ``ConnectionError``), never a
redis-py exception; the message names the server (password removed) and what we were
doing, because "Connection refused" alone does not say which of several URLs is wrong.
"""

from __future__ import annotations

import os
from typing import Final
from urllib.parse import urlsplit, urlunsplit

import redis.exceptions
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from kvrelay.errors import BrokerUnavailable
from kvrelay.redis_faults import WritesRefused, is_refusal
from kvrelay.sentinel_url import SentinelUrlError, is_sentinel_url, parse_sentinel_url

__all__ = [
    "DEFAULT_REDIS_URL",
    "REDIS_ERRORS",
    "REDIS_URL_VARIABLE",
    "connection_error",
    "make_redis",
    "redact_url",
    "resolve_url",
]

DEFAULT_REDIS_URL: Final = "redis://localhost:6379/0"
# Read when a client is created without a URL, as workers and the CLI read it.
REDIS_URL_VARIABLE: Final = "KVRELAY_REDIS_URL"

# What a lost or unreachable server looks like from redis-py and asyncio.
REDIS_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OSError,
    TimeoutError,
)


def resolve_url(url: str | None) -> str:
    """``url``, else ``$KVRELAY_REDIS_URL`` (when set and not empty), else the local default."""
    if url is not None:
        return url
    return os.environ.get(REDIS_URL_VARIABLE) or DEFAULT_REDIS_URL


def redact_url(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    if is_sentinel_url(url):
        try:
            return parse_sentinel_url(url).redacted()
        except SentinelUrlError:
            return "<unparseable sentinel url>"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" if user else f":***@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _refused(exc: BaseException | None) -> bool:
    """A refusal (``NOREPLICAS``, ``MISCONF``...) here or behind the wrapping around it
    (kombu's ``OperationalError``)."""
    while exc is not None:
        if isinstance(exc, WritesRefused) or is_refusal(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def connection_error(where: str, doing: str, exc: BaseException) -> BrokerUnavailable:
    """A ``kvrelay.BrokerUnavailable`` saying which server failed and during what."""
    detail = str(exc) or type(exc).__name__
    if _refused(exc):
        return BrokerUnavailable(f"Redis at {where} refused writes while {doing}: {detail}")
    return BrokerUnavailable(f"cannot reach Redis at {where} while {doing}: {detail}")


def make_redis(url: str, *, max_connections: int, connect_timeout: float) -> Redis:
    """The client for ordinary commands: a bounded pool, short retries, bytes replies.

    The pool is blocking and bounded so that 1,000 streams starting at once queue for
    a few dozen connections instead of opening 1,000. A ``redis+sentinel://`` URL gets
    the same pool, managed by the sentinels (``kvrelay.sentinel_connect``).
    """
    if is_sentinel_url(url):
        from kvrelay.sentinel_connect import sentinel_redis

        return sentinel_redis(parse_sentinel_url(url), max_connections=max_connections,
                              connect_timeout=connect_timeout)
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=max(connect_timeout, 1.0) * 4,
        socket_connect_timeout=connect_timeout,
        socket_timeout=max(connect_timeout, 10.0),
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
        decode_responses=False,
    )
    # from_pool: the client owns the pool, so ``aclose()`` disconnects it too.
    return Redis.from_pool(pool)
