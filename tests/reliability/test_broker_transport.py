"""The worker's broker transports restore unacknowledged messages after their connection
closed, where kombu's own raise.

Real Redis (a plain server; a primary, replica and three sentinels) and real kombu code:
a channel with a message delivered but not yet acknowledged, then the state a consumer
restart or a worker's stop leaves (the connection has unlinked its transport,
``transport.client = None``, and the channel's pool is gone), then the channel restores
its unacked messages as its close does. kombu's channels fail in ``_connparams``
(``'NoneType' object has no attribute 'hostname'``: the error that stopped a worker
during a failover, and during a Redis restart under load); the worker's put the message
back on its queue.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from helpers.sentinel_cluster import MASTER_NAME, SentinelCluster
from kombu import Connection, Exchange, Queue

from kvrelay_worker.broker_transport import REDIS_TRANSPORT, SENTINEL_TRANSPORT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(module_sentinels: SentinelCluster) -> SentinelCluster:
    return module_sentinels


def _restore_after_close(conn: Connection, name: str) -> int:
    """Deliver one message unacked, close as a consumer restart does, restore; the
    queue's length after the restore."""
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    with conn:
        producer = conn.Producer(serializer="json")
        producer.publish({"job": 1}, exchange=queue.exchange, routing_key=name,
                         declare=[queue])
        channel = conn.channel()
        message = channel.basic_get(name, no_ack=False)
        assert message is not None
        assert channel.client.llen(name) == 0
        conn.transport.client = None  # what Connection._do_close_transport does
        channel._pool = None  # what the channel's close does (its pools are dropped)
        channel.qos.restore_unacked()
        channel._pool = None
        conn.transport.client = conn  # only to read the queue back
        return int(channel.client.llen(name))


def _sentinel_connection(cluster: SentinelCluster, transport: str) -> Connection:
    url = ";".join(f"sentinel://127.0.0.1:{port}/0" for port in cluster.sentinel_ports)
    return Connection(url, transport=transport,
                      transport_options={"master_name": MASTER_NAME})


def test_kombus_own_sentinel_channel_cannot_restore_after_close(
        cluster: SentinelCluster) -> None:
    with pytest.raises(AttributeError, match="hostname"):
        _restore_after_close(_sentinel_connection(cluster, "sentinel"), "q-kombu")


def test_the_workers_sentinel_channel_restores_after_close(cluster: SentinelCluster) -> None:
    assert _restore_after_close(_sentinel_connection(cluster, SENTINEL_TRANSPORT),
                                "q-kvrelay") == 1


def test_kombus_own_redis_channel_cannot_restore_after_close(clean_redis_url: str) -> None:
    with pytest.raises(AttributeError, match="hostname"):
        _restore_after_close(Connection(clean_redis_url), "q-kombu-plain")


def test_the_workers_redis_channel_restores_after_close(clean_redis_url: str) -> None:
    assert _restore_after_close(Connection(clean_redis_url, transport=REDIS_TRANSPORT),
                                "q-kvrelay-plain") == 1


def _consume_across_a_false_failover(tmp_path: Path, transport: str) -> list[int]:
    """A consumer on the primary, which pauses long enough for the sentinels to promote
    its replica; a job pushed to the new primary afterwards: what the consumer gets
    within a few seconds, reconnecting whenever its connection is lost (as Celery's
    consumer restarts)."""
    cluster = SentinelCluster(tmp_path).start()
    try:
        first = cluster.primary_port()
        queue = Queue("q-moved", Exchange("q-moved", type="direct"), routing_key="q-moved")
        got: list[int] = []
        with _sentinel_connection(cluster, transport) as conn:
            consumer_conn = conn.clone()
            consumer = consumer_conn.Consumer([queue], accept=["json"],
                                              callbacks=[lambda body, m: (got.append(body["job"]),
                                                                          m.ack())])
            consumer.consume()
            with redis.Redis(host="127.0.0.1", port=first) as primary:
                primary.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
            deadline = time.monotonic() + 30
            while cluster.primary_port() == first:
                assert time.monotonic() < deadline, "the sentinels never failed over"
                time.sleep(0.1)
            time.sleep(3.0)  # the old primary answers again, still a primary
            with redis.Redis(host="127.0.0.1", port=first) as old:
                assert old.info("replication")["role"] == "master"
            producer_conn = _sentinel_connection(cluster, "sentinel")
            with producer_conn:
                producer_conn.Producer(serializer="json").publish(
                    {"job": 7}, exchange=queue.exchange, routing_key="q-moved",
                    declare=[queue])
            until = time.monotonic() + 4.0
            while not got and time.monotonic() < until:
                try:
                    consumer_conn.drain_events(timeout=0.5)
                except TimeoutError:
                    continue
                except consumer_conn.connection_errors:
                    consumer_conn = consumer_conn.clone()
                    consumer = consumer_conn.Consumer(
                        [queue], accept=["json"],
                        callbacks=[lambda body, m: (got.append(body["job"]), m.ack())])
                    consumer.consume()
            consumer_conn.release()
        return got
    finally:
        cluster.stop()


def test_kombus_sentinel_consumer_stays_on_a_replaced_primary(tmp_path: Path) -> None:
    assert _consume_across_a_false_failover(tmp_path, "sentinel") == []


def test_the_workers_sentinel_consumer_follows_the_new_primary(tmp_path: Path) -> None:
    assert _consume_across_a_false_failover(tmp_path, SENTINEL_TRANSPORT) == [7]
