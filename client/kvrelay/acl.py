"""The Redis ACL rules that confine one tenant (a ``Keyspace``) to its own names.

A tenant's user may touch keys and channels under its namespace's prefix only
(``~<prefix>*``, ``&<prefix>*``) and run only the commands kvrelay's clients, workers
and Celery's Redis transport send; nothing that lists or empties the whole server
(``KEYS``, ``SCAN``, ``FLUSHALL``, ``PUBSUB``, ``CONFIG``, ``MONITOR``...). Pattern
subscriptions are left out: Redis can only allow a pattern it is given literally, so
namespaced workers run without Celery's remote control (which needs ``PSUBSCRIBE``).

Apply with ``ACL SETUSER <user> on ><password> <rules...>`` (the README shows it).
"""

from __future__ import annotations

from typing import Final

from kvrelay.keys import Keyspace

__all__ = ["TENANT_COMMANDS", "tenant_acl_rules"]

# Everything a tenant's client, worker and Celery producer/consumer send (the commands
# and keys kvrelay's functions call included: Redis checks them against the same rules).
# No ``EVAL``, ``EVALSHA``, ``SCRIPT`` or ``FUNCTION``: those run any Lua, which can block
# the shared server; a tenant only calls, with ``FCALL``, the library an admin loaded
# (``kvrelay functions``).
TENANT_COMMANDS: Final = (
    # connection
    "auth", "hello", "ping", "select", "client|setname", "client|id",
    # pub/sub: events, control messages
    "subscribe", "unsubscribe", "publish",
    # strings, sets, hashes: abort flags, leases, watcher counts, the worker registry,
    # job records
    "get", "set", "mget", "del", "exists", "expire", "pexpire", "pttl", "incr", "decr",
    "sadd", "srem", "smembers",
    "hset", "hsetnx", "hget", "hdel", "hgetall", "hmget", "hvals", "hkeys", "hincrby",
    # Celery's queues and unacknowledged-message bookkeeping
    "lpush", "rpush", "rpop", "brpop", "llen", "lrange",
    "zadd", "zrem", "zrange", "zrangebyscore", "zrevrangebyscore", "zscore",
    # event logs
    "xadd", "xrange", "xrevrange", "xtrim", "xsetid",
    # kvrelay's functions (``kvrelay.redis_functions``; they read the server's clock),
    # behind sentinels the replica acknowledgement of writes and of reads
    # (``kvrelay.replica_wait``), and transactions
    "fcall", "time", "wait",
    "multi", "exec", "discard", "watch", "unwatch",
)


def tenant_acl_rules(keys: Keyspace) -> list[str]:
    """``ACL SETUSER`` rules (after ``on >password``) for a user of ``keys``' namespace."""
    if not keys.namespace:
        raise ValueError("the default namespace's prefix covers every tenant's: name one")
    return [
        "resetkeys", f"~{keys.prefix}*",
        "resetchannels", f"&{keys.prefix}*",
        "-@all", *(f"+{command}" for command in TENANT_COMMANDS),
    ]
