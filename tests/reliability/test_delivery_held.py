"""A message the consumer has taken from its queue while Redis refuses the write that
records it as unacknowledged is held, not lost.

kombu's consumer pops a message (``BRPOP``, or ``RPOP`` for ``basic_get``) and then
records it in its unacknowledged hash, the only copy a restart could restore. When Redis
starts refusing writes between the two (``NOREPLICAS`` or ``MISCONF`` right after a
push, chaos seed 338: the job was never received by any worker and its caller timed
out), kombu raises and the message is gone. The worker's channel sends the record again
until Redis takes it.

Real Redis and real kombu code; the refusal is a real one made deterministic with an ACL
rule (``NOPERM`` on ``ZADD``, the record's first command) lifted a second later.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from kombu import Connection, Exchange, Queue

from kvrelay_worker.broker_transport import REDIS_TRANSPORT

pytestmark = pytest.mark.integration

PASSWORD = "consumer-pw"


@pytest.fixture
def refused_consumer_url(clean_redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    """A URL whose user may do everything but ``ZADD`` (until granted), and an admin."""
    admin = redis.Redis.from_url(clean_redis_url)
    user = f"kvrelay-test-{uuid.uuid4().hex[:8]}"
    admin.execute_command("ACL", "SETUSER", user, "on", f">{PASSWORD}", "~*", "&*", "+@all",
                          "-zadd")
    parts = urlsplit(clean_redis_url)
    url = urlunsplit(parts._replace(netloc=f"{user}:{PASSWORD}@{parts.hostname}:{parts.port}"))
    try:
        yield url, admin
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


def _take_one(url: str, transport: str | None, admin: redis.Redis, name: str) -> object:
    """Publish one message (as the admin), then take it as the refused user while ZADD is
    granted a second later; returns the body taken."""
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    with Connection(_admin_url(admin)) as producer:
        producer.Producer(serializer="json").publish(
            {"job": 1}, exchange=queue.exchange, routing_key=name, declare=[queue])
    user = urlsplit(url).username
    grant = threading.Timer(1.0, lambda: admin.execute_command("ACL", "SETUSER", user, "+zadd"))
    grant.start()
    try:
        with Connection(url, transport=transport) as consumer:
            channel = consumer.channel()
            message = channel.basic_get(name, no_ack=False)
            assert message is not None
            body = message.decode()
            assert admin.hlen("unacked") == 1  # recorded: a restart would restore it
            channel.basic_ack(message.delivery_tag)
            return body
    finally:
        grant.join()


def _admin_url(admin: redis.Redis) -> str:
    kwargs = admin.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"


def test_kombus_own_channel_loses_a_message_it_could_not_record(
        refused_consumer_url: tuple[str, redis.Redis]) -> None:
    url, admin = refused_consumer_url
    with pytest.raises(redis.exceptions.NoPermissionError):
        _take_one(url, None, admin, "q-kombu")
    assert admin.llen("q-kombu") == 0  # taken from the queue
    assert admin.hlen("unacked") == 0  # and recorded nowhere


def test_the_workers_channel_holds_the_record_until_redis_takes_it(
        refused_consumer_url: tuple[str, redis.Redis]) -> None:
    url, admin = refused_consumer_url
    assert _take_one(url, REDIS_TRANSPORT, admin, "q-worker") == {"job": 1}
