"""The worker's Sentinel transport restores unacknowledged messages after its connection
closed, where kombu's own raises.

Real sentinels and real kombu code: a channel with a message delivered but not yet
acknowledged, then the state a consumer restart leaves (the connection has unlinked
its transport, ``transport.client = None``, and the channel's pool is gone with the
dead primary's connections), then the channel restores its unacked messages as its
close does. kombu's channel fails in ``_connparams`` (``'NoneType' object has no
attribute 'hostname'``: the error that stopped a worker during a failover); the
worker's puts the message back on its queue.
"""

from __future__ import annotations

import pytest
from helpers.sentinel_cluster import MASTER_NAME, SentinelCluster
from kombu import Connection, Exchange, Queue

from kvrelay_worker.sentinel_transport import TRANSPORT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(module_sentinels: SentinelCluster) -> SentinelCluster:
    return module_sentinels


def _restore_after_close(cluster: SentinelCluster, transport: str, name: str) -> int:
    """Deliver one message unacked, close as a consumer restart does, restore; the
    queue's length after the restore."""
    url = ";".join(f"sentinel://127.0.0.1:{port}/0" for port in cluster.sentinel_ports)
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    with Connection(url, transport=transport,
                    transport_options={"master_name": MASTER_NAME}) as conn:
        producer = conn.Producer(serializer="json")
        producer.publish({"job": 1}, exchange=queue.exchange, routing_key=name,
                         declare=[queue])
        channel = conn.channel()
        message = channel.basic_get(name, no_ack=False)
        assert message is not None
        assert channel.client.llen(name) == 0
        conn.transport.client = None  # what Connection._do_close_transport does
        channel._pool = None  # its connections died with the old primary
        channel.qos.restore_unacked()
        channel._pool = None
        conn.transport.client = conn  # only to read the queue back
        return int(channel.client.llen(name))


def test_kombus_own_channel_cannot_restore_after_close(cluster: SentinelCluster) -> None:
    with pytest.raises(AttributeError, match="hostname"):
        _restore_after_close(cluster, "sentinel", "q-kombu")


def test_the_workers_channel_restores_after_close(cluster: SentinelCluster) -> None:
    assert _restore_after_close(cluster, TRANSPORT, "q-kvrelay") == 1
