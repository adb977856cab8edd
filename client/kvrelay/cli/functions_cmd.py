"""``kvrelay functions``: load kvrelay's Redis Functions library, as an admin.

Workers load it themselves where their user may (the default namespace's); a tenant's
user may not (``FUNCTION LOAD`` runs any Lua), so an admin runs this once per Redis:
when creating tenants' users, after upgrading kvrelay, and after a restart that lost
the functions (no persistence).
"""

from __future__ import annotations

import click
import redis

from kvrelay.cli.errors import CliError
from kvrelay.cli.options import redis_url_option
from kvrelay.cli.target import redis_url_for
from kvrelay.connection import redact_url
from kvrelay.lua_library import LIBRARY
from kvrelay.redis_functions import Functions
from kvrelay.sentinel_connect import sync_sentinel_redis
from kvrelay.sentinel_url import is_sentinel_url, parse_sentinel_url


def admin_redis(url: str) -> redis.Redis:
    if is_sentinel_url(url):
        return sync_sentinel_redis(parse_sentinel_url(url), timeout=10.0)
    return redis.Redis.from_url(url, socket_timeout=10.0, socket_connect_timeout=10.0)


@click.command("functions")
@redis_url_option("Redis to load into, as a user that may run FUNCTION LOAD.")
def functions(redis_url: str | None) -> None:
    """Load kvrelay's Redis Functions (for tenants' users, upgrades, restarts)."""
    url, _ = redis_url_for(redis_url)
    client = admin_redis(url)
    try:
        scripts = Functions(client, LIBRARY)
        if not scripts.functions:
            click.echo(f"Redis at {redact_url(url)} has no functions (before 7): workers run "
                       "the scripts by EVALSHA; nothing to load (namespaces need Redis 7)")
            return
        scripts.load()
    except redis.RedisError as exc:
        raise CliError(f"could not load {LIBRARY.name} into {redact_url(url)}: {exc}") from None
    finally:
        client.close()
    click.echo(f"loaded {LIBRARY.name} into Redis at {redact_url(url)}")
