"""A private ``redis-server`` for tests: the one ``kvrelay up`` starts, with room for more
databases and a ``restart()`` that keeps the port.

Used by ``tests/conftest.py`` (the session ``redis_url``) and by chaos tests that need a
server of their own to stop and restart.
"""

from __future__ import annotations

from pathlib import Path

from kvrelay.cli.redis_server import PrivateRedis, find_redis_server, free_port

__all__ = ["RedisServer", "find_redis_server", "free_port"]


# Append-only with a sync per write: a stop and start keep every key.
DURABLE_ARGS = ("--appendonly", "yes", "--appendfsync", "always")


class RedisServer(PrivateRedis):
    """``PrivateRedis`` with 64 databases (module-scoped workers take one each);
    ``durable``: its data survives ``restart()`` (``DURABLE_ARGS``)."""

    def __init__(self, workdir: Path, *, port: int = 0, durable: bool = False) -> None:
        super().__init__(Path(workdir), port=port,
                         extra_args=("--databases", "64", *(DURABLE_ARGS if durable else ())))

    def restart(self) -> None:
        self.stop()
        self.start()
