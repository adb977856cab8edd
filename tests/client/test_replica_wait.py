"""``ReplicaWait``: writes stop waiting for a replica that does not answer, then try again."""

from __future__ import annotations

import logging
import time

import pytest
from redis._parsers.helpers import parse_sentinel_master

from kvrelay.primary_doubt import PrimaryInDoubt, doubt_in
from kvrelay.replica_wait import ReplicaWait


def test_waits_until_a_wait_comes_back_short_then_retries_later(
        caplog: pytest.LogCaptureFixture) -> None:
    wait = ReplicaWait(1, 200, retry_after_s=0.2)
    assert wait.wanted() == 1
    wait.observe(1)  # acknowledged: keep waiting
    assert wait.wanted() == 1
    with caplog.at_level(logging.WARNING, logger="kvrelay.replica_wait"):
        wait.observe(0)  # no replica answered within the timeout
        wait.observe(0)  # a second short answer is not logged again
    assert wait.wanted() == 0
    assert len(caplog.records) == 1
    assert "only 0 of 1 replicas" in caplog.text
    time.sleep(0.25)
    assert wait.wanted() == 1  # tried again after retry_after_s
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvrelay.replica_wait"):
        wait.observe(1)
    assert "acknowledge writes again" in caplog.text
    assert wait.wanted() == 1


def test_off_and_odd_replies() -> None:
    assert ReplicaWait(0, 200).wanted() == 0  # wait_replicas=0: never a WAIT
    wait = ReplicaWait(2, 50)
    wait.observe(b"garbage")  # not a count: ignored
    assert wait.wanted() == 2
    wait.observe(1)  # one of two is short too
    assert wait.wanted() == 0


def _sentinel_view(flags: str, port: int = 6380) -> dict[str, object]:
    """A ``SENTINEL MASTER`` reply as redis-py parses it (its own parser, on the raw pairs
    a sentinel sends)."""
    raw = ["name", "kvrelay-ha", "ip", "127.0.0.1", "port", str(port), "flags", flags,
           "num-slaves", "1", "num-other-sentinels", "2"]
    return parse_sentinel_master(raw)


def test_a_primary_is_in_doubt_while_any_sentinel_flags_it_or_names_another() -> None:
    healthy = _sentinel_view("master")
    assert doubt_in([healthy, healthy], ("127.0.0.1", 6380)) is None
    assert doubt_in([], ("127.0.0.1", 6380)) is None  # no sentinel answered: no evidence
    assert "failover_in_progress" in (doubt_in(
        [healthy, _sentinel_view("master,failover_in_progress")], ("127.0.0.1", 6380)) or "")
    assert "s_down" in (doubt_in([_sentinel_view("master,s_down")], None) or "")
    assert "127.0.0.1:6390" in (doubt_in([healthy, _sentinel_view("master", 6390)],
                                         ("127.0.0.1", 6380)) or "")


class _Sentinel:
    def __init__(self, flags: str) -> None:
        self.flags = flags
        self.asked = 0

    def sentinel_master(self, name: str) -> dict[str, object]:
        self.asked += 1
        return _sentinel_view(self.flags)


class _Pool:
    """What ``settle`` reads of a redis-py ``SentinelConnectionPool``."""

    def __init__(self, sentinel: _Sentinel) -> None:
        self.sentinel_manager = type("Manager", (), {"sentinels": [sentinel]})()
        self.service_name = "kvrelay-ha"
        self.master_address = ("127.0.0.1", 6380)
        self.disconnects = 0

    def disconnect(self) -> None:
        self.disconnects += 1


def test_a_short_wait_asks_the_sentinels_and_a_doubt_means_send_again() -> None:
    sentinel = _Sentinel("master,failover_in_progress")
    pool = _Pool(sentinel)
    wait = ReplicaWait(1, 200)
    wait.settle(1, pool)  # acknowledged: nobody asked
    assert sentinel.asked == 0
    with pytest.raises(PrimaryInDoubt, match="failover_in_progress"):
        wait.settle(0, pool)
    assert (sentinel.asked, pool.disconnects) == (1, 1)
    assert wait.wanted() == 1  # still waiting: the write goes again, and waits again
    sentinel.flags = "master"  # the replica is just down: stop waiting for a while
    wait.settle(0, pool)
    assert wait.wanted() == 0
    assert pool.disconnects == 1


def test_unwaited_writes_ask_the_sentinels_at_most_every_probe_period() -> None:
    sentinel = _Sentinel("master")
    pool = _Pool(sentinel)
    wait = ReplicaWait(1, 200, probe_every_s=0.2)
    wait.settle(None, pool)  # not degraded: no WAIT was wanted, nothing to ask
    assert sentinel.asked == 0
    wait.settle(0, pool)  # degraded now
    for _ in range(5):
        wait.settle(None, pool)
    assert sentinel.asked == 2  # the short WAIT's question, then one for the period
    time.sleep(0.25)
    sentinel.flags = "master,o_down"
    with pytest.raises(PrimaryInDoubt):
        wait.settle(None, pool)
    assert ReplicaWait(0, 200).settle(None, pool) is None  # plain mode never asks
    assert sentinel.asked == 3
