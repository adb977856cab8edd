"""Databases of the test Redis: one of its own per module-scoped worker or CLI test, emptied
first, so tests do not see each other's keys."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis


def url_with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def flushed(url: str) -> str:
    """``url``, its database emptied (FLUSHDB)."""
    client = redis.Redis.from_url(url, socket_connect_timeout=5)
    try:
        client.flushdb()
    finally:
        client.close()
    return url


def fresh_db_url(url: str, db: int) -> str:
    """``url`` pointed at database ``db``, emptied."""
    return flushed(url_with_db(url, db))
