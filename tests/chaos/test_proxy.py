"""The chaos proxy against a real Redis: a cut resets and refuses, a blackhole holds
bytes (a call times out, a write sent meanwhile lands once it heals), latency delays
every chunk in order, and behind real sentinels a worker's view names its own listeners.
Every fault the harness draws through the proxy is only as real as these."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis
import redis.sentinel
from helpers.redis_server import RedisServer
from helpers.sentinel_cluster import MASTER_NAME, SentinelCluster

from chaos.proxy import HOST, ProxyGroup, ProxyHub, Route
from chaos.sentinel_view import ReplyRewriter

pytestmark = pytest.mark.integration
T = TypeVar("T")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    yield redis_server
    redis_server.stop()


@pytest.fixture
def hub() -> Iterator[ProxyHub]:
    proxies = ProxyHub()
    yield proxies
    proxies.close()


def _client(group: ProxyGroup, timeout: float = 2.0) -> redis.Redis:
    return redis.Redis(host=HOST, port=group.port("redis"), socket_timeout=timeout,
                       socket_connect_timeout=timeout, retry=None)


def test_a_cut_resets_connections_and_refuses_new_ones(server: RedisServer,
                                                       hub: ProxyHub) -> None:
    group = hub.group("w0", [Route("redis", server.port)])
    with _client(group) as client:
        client.set("k", "before")
        group.cut()
        with pytest.raises(redis.ConnectionError):
            client.get("k")  # the open connection was reset
        with pytest.raises(redis.ConnectionError, match="refused"):
            with _client(group) as fresh:
                fresh.ping()
        assert group.connections() == 0
        group.heal_cut()
        client.set("k", "after")
        assert client.get("k") == b"after"


def _within(seconds: float, call: Callable[[], T]) -> T:
    """``call`` retried on a timeout for up to ``seconds``: the short-timeout client's
    calls through a healthy proxy can stall past 0.5 s on a loaded 2-core machine, and
    such a stall is not the fault under test."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except redis.TimeoutError:
            if time.monotonic() > deadline:
                raise


def test_a_blackhole_times_calls_out_and_delivers_what_it_held(server: RedisServer,
                                                               hub: ProxyHub) -> None:
    group = hub.group("w0", [Route("redis", server.port)])
    direct = redis.Redis(host=HOST, port=server.port)
    with _client(group, timeout=0.5) as client:
        _within(5, client.ping)  # an open connection for the blackhole to hold
        group.blackhole()
        with pytest.raises(redis.TimeoutError):
            client.set("held", "1")  # held in the proxy: no reply within the timeout
        time.sleep(0.3)
        assert direct.get("held") is None  # nor did it reach Redis
        group.heal_blackhole()
        deadline = time.monotonic() + 5
        while direct.get("held") is None:  # delivered late, as TCP retransmission would
            assert time.monotonic() < deadline, "the held write never reached Redis"
            time.sleep(0.05)
        _within(5, lambda: client.set("k", "v"))  # the client's next connection works
        assert _within(5, lambda: client.get("k")) == b"v"
    direct.close()


def test_latency_delays_each_chunk_in_order(server: RedisServer, hub: ProxyHub) -> None:
    group = hub.group("w0", [Route("redis", server.port)])
    with _client(group) as client:
        client.ping()
        hub.set_latency(0.2)
        began = time.monotonic()
        pipe = client.pipeline(transaction=False)
        for i in range(50):
            pipe.rpush("order", i)
        pipe.lrange("order", 0, -1)
        replies = pipe.execute()
        took = time.monotonic() - began
        hub.set_latency(0.0)
    assert [int(x) for x in replies[-1]] == list(range(50))
    assert took >= 0.4, f"a round trip through 0.2 s each way took {took:.3f}s"


def test_the_rewriter_maps_server_ports_in_split_replies() -> None:
    rewriter = ReplyRewriter({6380: 41001})
    reply = (b"*6\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$4\r\nport\r\n$4\r\n6380\r\n"
             b"$4\r\nname\r\n$14\r\n127.0.0.1:6380\r\n"
             b"+switch-master m 127.0.0.1 6381 127.0.0.1 6380\r\n:6380\r\n$-1\r\n")
    out = b"".join(rewriter.feed(reply[i:i + 7]) for i in range(0, len(reply), 7))
    assert out == (b"*6\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$4\r\nport\r\n$5\r\n41001\r\n"
                   b"$4\r\nname\r\n$15\r\n127.0.0.1:41001\r\n"
                   b"+switch-master m 127.0.0.1 6381 127.0.0.1 41001\r\n:6380\r\n$-1\r\n")


def test_behind_sentinels_the_primary_is_reached_through_the_group(tmp_path: Path,
                                                                   hub: ProxyHub) -> None:
    cluster = SentinelCluster(tmp_path / "ha").start()
    try:
        servers = {"redis0": cluster.primary.port, "redis1": cluster.replica.port}
        routes = [Route(name, port) for name, port in servers.items()]
        routes.append(Route("sentinel0", cluster.sentinel_ports[0], slow=False))
        group = hub.group("w0", routes, lambda g: {"sentinel0": {
            port: g.port(name) for name, port in servers.items()}})
        sentinel = redis.sentinel.Sentinel([(HOST, group.port("sentinel0"))],
                                           sentinel_kwargs={"socket_timeout": 2})
        assert sentinel.discover_master(MASTER_NAME) == (HOST, group.port("redis0"))
        client = sentinel.master_for(MASTER_NAME, socket_timeout=1, retry=None)
        client.set("k", "v")
        group.cut()
        with pytest.raises(redis.ConnectionError):
            client.get("k")  # its connection went through the group
        group.heal_cut()
        assert client.get("k") == b"v"
        client.close()
    finally:
        cluster.stop()
