"""Which server carried a pipeline of writes, and which primary a pool names now.

A short ``WAIT`` says something about the server that ran the write, not about the
primary a Sentinel-managed pool names by the time the reply comes. The pool moves on as
soon as any of its users opens a connection after a failover, while a write may still
be held on the old primary (``CLIENT PAUSE WRITE``, a partition) and complete there,
where it vanishes once that server is demoted. So the write's verdict
(``kvrelay.primary_doubt``) and the degraded mode of ``kvrelay.replica_wait`` are keyed
by the address of the connection that carried it, read as the pipeline hands that
connection back, after redis-py's own retries (a retried pipeline reconnects, to the
primary the sentinels name then, and runs whole again there).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Address", "aexecute_noting_carrier", "connection_address", "execute_noting_carrier",
           "pool_primary"]

# A server's (host, port), as the sentinels name it and as a connection dialled it.
Address = tuple[str, int]


def connection_address(connection: Any) -> Address | None:
    """The (host, port) a redis-py connection is connected to (None: a unix socket)."""
    host, port = getattr(connection, "host", None), getattr(connection, "port", None)
    if not isinstance(host, str) or port is None:
        return None
    return host, int(port)


def pool_primary(pool: Any) -> Address | None:
    """The primary a Sentinel-managed pool names now (None: another pool, or one that has
    not looked the primary up yet)."""
    address = getattr(pool, "master_address", None)
    if not isinstance(address, tuple) or len(address) != 2:
        return None
    return str(address[0]), int(address[1])


def execute_noting_carrier(pipe: Any, *,
                           raise_on_error: bool = True) -> tuple[list[Any], Address | None]:
    """``pipe.execute()`` and the address of the connection that ran it.

    The pipeline releases its connection in ``reset`` (its last step, also on failure);
    the address is read there, before another thread may take the connection and
    reconnect it elsewhere.
    """
    carried: list[Address | None] = []
    release = pipe.reset

    def reset() -> None:
        if pipe.connection is not None:
            carried.append(connection_address(pipe.connection))
        release()

    pipe.reset = reset
    try:
        replies = list(pipe.execute(raise_on_error=raise_on_error))
    finally:
        del pipe.reset  # the class's own again
    return replies, carried[-1] if carried else None


async def aexecute_noting_carrier(pipe: Any, *, raise_on_error: bool = True
                                  ) -> tuple[list[Any], Address | None]:
    """``execute_noting_carrier`` for a ``redis.asyncio`` pipeline."""
    carried: list[Address | None] = []
    release = pipe.reset

    async def reset() -> None:
        if pipe.connection is not None:
            carried.append(connection_address(pipe.connection))
        await release()

    pipe.reset = reset
    try:
        replies = list(await pipe.execute(raise_on_error=raise_on_error))
    finally:
        del pipe.reset
    return replies, carried[-1] if carried else None
