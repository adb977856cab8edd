"""The metrics endpoint is unauthenticated, so it listens on loopback unless told otherwise.

Listening addresses are read from the kernel's socket table (``/proc/net/tcp``), the
same table ``ss -ltn`` shows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from helpers.redis_server import free_port
from helpers.worker_process import WorkerProcess

from kvrelay_worker.metrics import WorkerMetrics

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads Linux's /proc/net/tcp")

_LISTEN = "0A"


def listening_addresses(port: int) -> set[str]:
    """IPv4 addresses with a listening TCP socket on ``port``."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        hex_ip, hex_port = local.split(":")
        if state == _LISTEN and int(hex_port, 16) == port:
            octets = bytes.fromhex(hex_ip)[::-1]  # little-endian on the hosts we run on
            found.add(".".join(str(b) for b in octets))
    return found


@pytest.mark.integration
def test_a_worker_serves_metrics_on_loopback_by_default(
        start_worker: Callable[..., WorkerProcess]) -> None:
    port = free_port()
    start_worker("private-metrics", concurrency=2, metrics_port=port)
    assert listening_addresses(port) == {"127.0.0.1"}
    assert "kvrelay_jobs" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text


def test_metrics_host_opens_every_interface_when_asked() -> None:
    metrics = WorkerMetrics("open")
    port = metrics.serve(0, "0.0.0.0")
    assert listening_addresses(port) == {"0.0.0.0"}
