"""A private ``redis-server`` for tests: the one ``kvrelay up`` starts, with room for more
databases and a ``restart()`` that keeps the port.

Used by ``tests/conftest.py`` (the session ``redis_url``) and by chaos tests that need a
server of their own to stop and restart.
"""

from __future__ import annotations

from pathlib import Path

from kvrelay.cli.redis_server import PrivateRedis, find_redis_server, free_port

__all__ = ["RedisServer", "find_redis_server", "free_port"]


class RedisServer(PrivateRedis):
    """``PrivateRedis`` with 64 databases (module-scoped workers take one each)."""

    def __init__(self, workdir: Path, *, port: int = 0) -> None:
        super().__init__(Path(workdir), port=port, extra_args=("--databases", "64"))

    def restart(self) -> None:
        self.stop()
        self.start()
