"""A push handed a channel kombu has closed is a connection error, and is pushed again.

kombu closes a channel when it collects its connection (a failover's reconnect does),
setting ``channel.connection`` to None. The SDK's wrapped ``Channel._put``
(``kvrelay.queue_push``) read the broker's transport options through it and failed with
``AttributeError: 'NoneType' object has no attribute 'client'``, which no retry takes:
the job was lost (seen in ``test_a_push_held_on_the_replaced_primary_reaches_the_new_one``).
Now it raises ``ChannelClosed``, one of kombu's Redis connection errors, so Celery's
publish retry reconnects and pushes the job.

Real Redis, real kombu connections and channels, really closed.
"""

from __future__ import annotations

import base64
import json

import pytest
import redis
from kombu import Connection, Producer
from kombu.transport import redis as kombu_redis

from kvrelay.queue_push import ChannelClosed, at_front

pytestmark = pytest.mark.timeout(60)


def test_a_push_on_a_closed_channel_raises_a_kombu_connection_error(
        clean_redis_url: str) -> None:
    with Connection(clean_redis_url) as connection:
        channel = connection.channel()
        channel.close()
        assert channel.connection is None
        with at_front(), pytest.raises(kombu_redis.Transport.connection_errors) as caught:
            channel._put("kvrelay-closed-channel", {"body": "x", "properties": {}})
    assert isinstance(caught.value, ChannelClosed), repr(caught.value)
    assert "closed" in str(caught.value)
    with redis.Redis.from_url(clean_redis_url) as server:
        assert server.llen("kvrelay-closed-channel") == 0  # nothing was sent


def test_a_push_on_a_closed_channel_is_pushed_again_on_a_new_one(
        clean_redis_url: str) -> None:
    """kombu's publish retry (``Connection.ensure``, as Celery's ``send_task`` uses it)
    takes the error, reconnects, and the push lands."""
    queue = "kvrelay-closed-channel"
    policy = {"max_retries": 3, "interval_start": 0.05, "interval_step": 0.05}
    with Connection(clean_redis_url) as connection:
        producer = Producer(connection)
        with at_front():
            producer.publish({"n": 1}, routing_key=queue, retry=True, retry_policy=policy)
            closed = producer.channel
            closed.close()
            assert closed.connection is None
            producer.publish({"n": 2}, routing_key=queue, retry=True, retry_policy=policy)
        assert producer.channel is not closed
    with redis.Redis.from_url(clean_redis_url) as server:
        messages = server.lrange(queue, 0, -1)
    bodies = [json.loads(base64.b64decode(json.loads(message)["body"])) for message in messages]
    assert bodies == [{"n": 1}, {"n": 2}], bodies
