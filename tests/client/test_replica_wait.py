"""``ReplicaWait``: writes stop waiting for a replica that does not answer, then try again."""

from __future__ import annotations

import logging
import time

import pytest
from redis._parsers.helpers import parse_sentinel_master

from kvrelay.primary_doubt import (
    PrimaryInDoubt,
    ReplicaLagging,
    SentinelView,
    Verdict,
    verdict,
)
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


def _parsed(flags: str, port: int, link: str = "ok") -> dict[str, object]:
    """A sentinel's reply on one server as redis-py parses it (its own parser, on the
    raw pairs a sentinel sends)."""
    raw = ["name", "kvrelay-ha", "ip", "127.0.0.1", "port", str(port), "flags", flags,
           "num-slaves", "1", "num-other-sentinels", "2", "master-link-status", link]
    return parse_sentinel_master(raw)


def _view(master_flags: str = "master", port: int = 6380,
          replica_flags: tuple[str, ...] = ("slave",)) -> SentinelView:
    return _parsed(master_flags, port), [_parsed(f, 6381) for f in replica_flags]


OURS = ("127.0.0.1", 6380)


def test_a_short_wait_is_judged_from_every_sentinels_view() -> None:
    healthy = _view()
    assert verdict([healthy, healthy], OURS)[0] is Verdict.LAGGING  # up, behind
    # Nobody answered: nothing says this server is still the primary.
    assert verdict([], OURS) == (Verdict.IN_DOUBT, "no sentinel answered")
    down = _view(replica_flags=("slave,s_down", "slave,disconnected"))
    assert verdict([down, down], OURS)[0] is Verdict.REPLICA_DOWN
    assert verdict([down, healthy], OURS)[0] is Verdict.LAGGING  # one sentinel sees it up
    # A demoted primary that still says it is one: listed as a replica, its link down.
    unlinked = (_parsed("master", 6380), [_parsed("slave", 6381, link="err")])
    assert verdict([unlinked], OURS)[0] is Verdict.REPLICA_DOWN
    found, why = verdict([healthy, _view("master,failover_in_progress")], OURS)
    assert found is Verdict.IN_DOUBT
    assert "failover_in_progress" in why
    assert verdict([_view("master,s_down")], None)[0] is Verdict.IN_DOUBT
    found, why = verdict([healthy, _view(port=6390)], OURS)
    assert found is Verdict.IN_DOUBT
    assert "127.0.0.1:6390" in why


class _Sentinel:
    def __init__(self, master_flags: str, replica_flags: str = "slave") -> None:
        self.master_flags = master_flags
        self.replica_flags = replica_flags
        self.asked = 0
        self.port = OURS[1]  # the primary it names

    def sentinel_master(self, name: str) -> dict[str, object]:
        self.asked += 1
        return _parsed(self.master_flags, self.port)

    def sentinel_slaves(self, name: str) -> list[dict[str, object]]:
        return [_parsed(self.replica_flags, 6381)]


class _Pool:
    """What ``settle`` reads of a redis-py ``SentinelConnectionPool``."""

    def __init__(self, sentinel: _Sentinel) -> None:
        self.sentinel_manager = type("Manager", (), {"sentinels": [sentinel]})()
        self.service_name = "kvrelay-ha"
        self.master_address = OURS
        self.lookups = 0

    def get_master_address(self) -> tuple[str, int]:
        self.lookups += 1
        return self.master_address


def test_a_primary_in_doubt_means_send_again_to_the_primary_named_now() -> None:
    sentinel = _Sentinel("master,failover_in_progress")
    pool = _Pool(sentinel)
    wait = ReplicaWait(1, 200)
    wait.settle(1, pool)  # acknowledged: nobody asked
    assert sentinel.asked == 0
    with pytest.raises(PrimaryInDoubt, match="failover_in_progress"):
        wait.settle(0, pool)
    assert (sentinel.asked, pool.lookups) == (1, 1)
    assert wait.wanted(pool) == 1  # still waiting: the write goes again, and waits again
    sentinel.master_flags, sentinel.replica_flags = "master", "slave,s_down"
    wait.settle(0, pool)  # the replica is down: stop waiting for a while
    assert wait.wanted(pool) == 0
    assert pool.lookups == 1


def test_a_lagging_replica_is_waited_for_again_a_few_times() -> None:
    pool = _Pool(_Sentinel("master"))
    wait = ReplicaWait(1, 200, lag_retries=2)
    for _ in range(2):
        with pytest.raises(ReplicaLagging):
            wait.settle(0, pool)
        assert wait.wanted(pool) == 1
    wait.settle(0, pool)  # a third short answer in a row: as if it were down
    assert wait.wanted(pool) == 0


def test_unwaited_writes_ask_the_sentinels_at_most_every_probe_period() -> None:
    sentinel = _Sentinel("master", "slave,s_down")
    pool = _Pool(sentinel)
    wait = ReplicaWait(1, 200, probe_every_s=0.2)
    wait.settle(None, pool)  # not degraded: no WAIT was wanted, nothing to ask
    assert sentinel.asked == 0
    wait.settle(0, pool)  # degraded now
    for _ in range(5):
        wait.settle(None, pool)
    assert sentinel.asked == 2  # the short WAIT's question, then one for the period
    assert wait.wanted(pool) == 0
    time.sleep(0.25)
    sentinel.master_flags = "master,o_down"
    with pytest.raises(PrimaryInDoubt):
        wait.settle(None, pool)
    time.sleep(0.25)
    sentinel.master_flags, sentinel.replica_flags = "master", "slave"
    wait.settle(None, pool)  # the replica is back: the next write waits again
    assert wait.wanted(pool) == 1
    assert ReplicaWait(0, 200).settle(None, pool) is None  # plain mode never asks
    assert sentinel.asked == 4


OTHER = ("127.0.0.1", 6390)


def test_a_short_wait_is_judged_by_the_server_that_carried_the_write() -> None:
    """The pool names the new primary already; the write went to the old one."""
    sentinel = _Sentinel("master", "slave,s_down")
    sentinel.port = OTHER[1]
    pool = _Pool(sentinel)
    pool.master_address = OTHER
    wait = ReplicaWait(1, 200)
    with pytest.raises(PrimaryInDoubt, match=r"went to 127\.0\.0\.1:6380"):
        wait.settle(0, pool, OURS)
    wait.settle(0, pool, OTHER)  # the new primary, no replica yet: it degrades, alone
    assert wait.wanted(pool) == 0
    pool.master_address = OURS
    assert wait.wanted(pool) == 1


def test_an_unwaited_write_another_server_took_is_judged_at_once() -> None:
    """Planned unwaited for a degraded primary, carried by another: asked about now."""
    sentinel = _Sentinel("master", "slave")
    sentinel.port = OTHER[1]
    pool = _Pool(sentinel)
    wait = ReplicaWait(1, 200, probe_every_s=60.0)
    with pytest.raises(ReplicaLagging):  # its replica is up: sent again, waiting
        wait.settle(None, pool, OTHER, unplanned=True)
    sentinel.replica_flags = "slave,s_down"
    wait.settle(None, pool, OTHER, unplanned=True)  # no replica: that primary degrades
    pool.master_address = OTHER
    assert wait.wanted(pool) == 0
    assert sentinel.asked == 2
