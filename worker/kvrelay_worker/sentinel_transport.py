"""kombu's Redis Sentinel transport, with its channel able to reconnect after close.

When Celery's consumer restarts (the primary died, a write was refused), kombu closes
the old connection, which unlinks its transport from the connection's parameters
(``transport.client = None``), and only then closes the old channels. A channel that
still holds unacknowledged messages restores them to the queue on close, and for that
opens a new client: kombu's Sentinel channel builds its pool from
``self.connection.client``, finds None, and raises ``AttributeError`` — which Celery
takes for an unrecoverable error and stops the worker. (Seen with kombu 5.7.0 during a
Sentinel failover under load.)

This channel keeps the parameters it was created with and puts them back on its
transport when they are gone, so the restore reaches the new primary like any other
call. Celery uses it through ``broker_transport`` (``kvrelay_worker.app``) for
``redis+sentinel://`` URLs; the SDK's producer never restores messages and keeps
kombu's own.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

TRANSPORT = "kvrelay_worker.sentinel_transport:SentinelTransport"


class SentinelChannel(kombu_redis.SentinelChannel):
    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        self._connection_params = connection.client
        super().__init__(connection, *args, **kwargs)

    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None and self._connection_params is not None:
            self.connection.client = self._connection_params
        return super()._connparams(asynchronous)


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel
