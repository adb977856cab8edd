"""A database of its own on the test Redis, so module-scoped workers do not see other tests."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis


def url_with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def fresh_db_url(url: str, db: int) -> str:
    """``url`` pointed at database ``db``, emptied."""
    target = url_with_db(url, db)
    client = redis.Redis.from_url(target)
    try:
        client.flushdb()
    finally:
        client.close()
    return target
