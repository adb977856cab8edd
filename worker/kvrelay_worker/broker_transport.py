"""kombu's Redis transports (plain and Sentinel), with channels able to reconnect after
their connection closed.

When Celery's consumer restarts (Redis restarted, the primary died, a write was
refused) or the worker stops, kombu closes the old connection, which unlinks its
transport from the connection's parameters (``transport.client = None``), and only then
closes the old channels, which drops their pools. A channel that still holds
unacknowledged messages restores them to the queue on close, and a message acknowledged
late (the hub's close acknowledges what finished meanwhile) needs a client too: both
build a new pool from ``self.connection.client``, find None, and raise
``AttributeError`` — which Celery takes for an unrecoverable error and stops the worker.
(Seen with kombu 5.7.0 during a Sentinel failover under load, and during a Redis
restart under load.)

These channels keep the parameters they were created with and put them back on their
transport when they are gone, so the call reaches Redis (the new primary) like any
other. Celery uses them through ``broker_transport`` (``kvrelay_worker.app``); the SDK's
producer never restores messages and keeps kombu's own.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

REDIS_TRANSPORT = "kvrelay_worker.broker_transport:RedisTransport"
SENTINEL_TRANSPORT = "kvrelay_worker.broker_transport:SentinelTransport"


class _KeepsParams:
    """Mixed into a kombu Redis channel: ``_connparams`` works after its connection
    unlinked its parameters."""

    connection: Any

    def _remember(self, connection: Any) -> None:
        self._connection_params = connection.client

    def _relink(self) -> None:
        if self.connection.client is None and self._connection_params is not None:
            self.connection.client = self._connection_params


class RedisChannel(_KeepsParams, kombu_redis.Channel):
    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        self._remember(connection)
        super().__init__(connection, *args, **kwargs)

    def _connparams(self, asynchronous: bool = False) -> Any:
        self._relink()
        return super()._connparams(asynchronous)


class SentinelChannel(_KeepsParams, kombu_redis.SentinelChannel):
    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        self._remember(connection)
        super().__init__(connection, *args, **kwargs)

    def _connparams(self, asynchronous: bool = False) -> Any:
        self._relink()
        return super()._connparams(asynchronous)


class RedisTransport(kombu_redis.Transport):
    Channel = RedisChannel


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel
