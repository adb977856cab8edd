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
other. They also hold on to a message they have just taken from the queue while Redis
refuses the write that records it as unacknowledged (``HeldQoS``). Celery uses them
through ``broker_transport`` (``kvrelay_worker.app``); the SDK's producer never restores
messages and keeps kombu's own.
"""

from __future__ import annotations

import time
from typing import Any

import kombu.transport
import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual
from kombu.utils.json import dumps

from kvrelay_worker.jobs.held_writes import until_written

# Transport options a worker's app sets: where and under which name its channel records
# the messages it took (``HeldQoS``).
DELIVERED_KEY_OPTION = "kvrelay_delivered_key"
WORKER_ID_OPTION = "kvrelay_worker_id"
REDIS_TRANSPORT = "kvrelay_worker.broker_transport:RedisTransport"
SENTINEL_TRANSPORT = "kvrelay_worker.broker_transport:SentinelTransport"
# How often a consumer behind sentinels asks them which primary they name.
PRIMARY_CHECK_S = 1.0
# kombu's name for its Sentinel transport, the scheme of each sentinel's broker URL.
SENTINEL_SCHEME = "sentinel"


def own_the_sentinel_scheme() -> None:
    """Make ``sentinel://`` mean this module's transport in this process.

    The app names the transport (``broker_transport``), but when a connection attempt
    fails (no sentinel names a primary during a failover, none is reachable) kombu
    moves to the next sentinel's URL (``Connection.switch``), which takes the transport
    from the URL's scheme instead: the consumer went on with kombu's own Sentinel
    transport, without these channels (no record of whose deliveries are whose, no
    leaving a replaced primary, no reconnecting after a close) for the rest of the
    worker's life. A worker's every ``sentinel://`` connection is its broker's."""
    kombu.transport.TRANSPORT_ALIASES[SENTINEL_SCHEME] = SENTINEL_TRANSPORT


class HeldQoS(kombu_redis.QoS):
    """kombu's QoS, except that recording a delivered message as unacknowledged is held
    and sent again while Redis refuses it (``NOREPLICAS``, ``MISCONF``, ...) or is out
    of reach, as the worker's other state writes are (``until_written``). The message
    has already left the queue (the ``BRPOP`` that took it was answered just before the
    refusals began): kombu would raise, restart the consumer and lose it, since only its
    unacknowledged record could restore it. An acknowledgement is held the same way: one
    lost would leave a finished job's message to be restored after the visibility timeout.

    The record also names the worker that took the message (``Keyspace.celery_delivered``,
    in the same transaction), so that live workers give back the messages of a worker
    that died before claiming their jobs (``jobs.dead_deliveries``), not kombu 6 h later."""

    def append(self, message: Any, delivery_tag: Any) -> None:
        until_written(lambda: self._record(message, delivery_tag),
                      "the record of a delivered message")
        kombu_virtual.QoS.append(self, message, delivery_tag)

    def _record(self, message: Any, delivery_tag: Any) -> None:
        """kombu's record of a delivered message, and the worker that took it, at once."""
        delivery = message.delivery_info
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()})
            pipe.hset(self.unacked_key, delivery_tag,
                      dumps([message._raw, delivery["exchange"], delivery["routing_key"]]))
            owner = self._owner()
            if owner is not None:
                pipe.hset(owner[0], delivery_tag, owner[1])
            pipe.execute()

    def ack(self, delivery_tag: Any) -> None:
        until_written(lambda: self._remove_from_indices(delivery_tag).execute(),
                      "the acknowledgement of a message")
        kombu_virtual.QoS.ack(self, delivery_tag)

    def _remove_from_indices(self, delivery_tag: Any, pipe: Any = None) -> Any:
        pipe = super()._remove_from_indices(delivery_tag, pipe)
        owner = self._owner()
        return pipe if owner is None else pipe.hdel(owner[0], delivery_tag)

    def __init__(self, channel: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(channel, *args, **kwargs)
        # Read once, from the parameters the channel kept (``_KeepsParams``): after a
        # reconnect kombu unlinks ``channel.connection.client`` before the old channel
        # restores or acknowledges its messages, and those calls name the owner too.
        self._owner_of_deliveries = _delivery_owner(channel)

    def _owner(self) -> tuple[str, str] | None:
        """(the delivered hash's name for kombu, this worker's id), or None: a consumer
        that is not a worker."""
        return self._owner_of_deliveries


def _delivery_owner(channel: Any) -> tuple[str, str] | None:
    """The owner named by the transport options the worker's app sets, read from the
    parameters the channel was created with."""
    params = getattr(channel, "_connection_params", None)
    if params is None:
        params = channel.connection.client
    options = getattr(params, "transport_options", None) or {}
    key, worker = options.get(DELIVERED_KEY_OPTION), options.get(WORKER_ID_OPTION)
    return (str(key), str(worker)) if key and worker else None


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
    QoS = HeldQoS

    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        self._remember(connection)
        super().__init__(connection, *args, **kwargs)

    def _connparams(self, asynchronous: bool = False) -> Any:
        self._relink()
        return super()._connparams(asynchronous)


class SentinelChannel(_KeepsParams, kombu_redis.SentinelChannel):
    """Also leaves a primary the sentinels replaced: a primary that survived its failover
    (it paused, or was cut off from the sentinels) keeps answering the consumer's
    ``BRPOP`` on its old connection, so jobs pushed to the new primary would wait until
    it is demoted. Before each ``BRPOP`` (at most every ``PRIMARY_CHECK_S``) the channel
    asks the sentinels, and a primary they no longer name is a lost connection: Celery
    restarts the consumer, which connects to the new one."""

    QoS = HeldQoS

    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        self._remember(connection)
        self._next_primary_check = 0.0
        super().__init__(connection, *args, **kwargs)

    def _connparams(self, asynchronous: bool = False) -> Any:
        self._relink()
        return super()._connparams(asynchronous)

    def _brpop_start(self, timeout: Any = None) -> Any:
        self._leave_a_replaced_primary()
        return super()._brpop_start(timeout)

    def _leave_a_replaced_primary(self) -> None:
        now = time.monotonic()
        if now < self._next_primary_check:
            return
        self._next_primary_check = now + PRIMARY_CHECK_S
        connection = getattr(self.client, "connection", None)
        if connection is None or getattr(connection, "host", None) is None:
            return
        try:
            host, port = self.async_pool.get_master_address()
        except redis.RedisError:  # no sentinel answered: no evidence it moved
            return
        if (str(host), int(port)) != (str(connection.host), int(connection.port)):
            raise redis.ConnectionError(
                f"the sentinels name {host}:{port} as the primary, not "
                f"{connection.host}:{connection.port}")


class RedisTransport(kombu_redis.Transport):
    Channel = RedisChannel


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel
