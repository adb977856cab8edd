"""``ReplicaWait``: writes stop waiting for a replica that does not answer, then try again."""

from __future__ import annotations

import logging
import time

import pytest

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
