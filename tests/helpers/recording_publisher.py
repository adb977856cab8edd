"""A stand-in for the worker's publisher that records what the engine thread hands over,
so engine-service tests read a job's events without Redis."""

from __future__ import annotations

import threading
import time
from typing import Any

from kvrelay.protocol import Failed, Finished
from kvrelay_worker.jobs.publisher import EventItem, Item


class RecordingPublisher:
    """Collects the items the engine thread hands over, in order."""

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.lock = threading.Lock()

    def put(self, items: list[Item]) -> None:
        with self.lock:
            self.items.extend(items)

    def events(self, job_id: str) -> list[Any]:
        with self.lock:
            return [i.event for i in self.items
                    if isinstance(i, EventItem) and i.job.job_id == job_id]

    def wait_events(self, job_id: str, timeout: float = 120.0) -> list[Any]:
        """Every event of the job once it has ended (Finished or Failed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.events(job_id)
            if events and isinstance(events[-1], (Finished, Failed)):
                return events
            time.sleep(0.01)
        raise TimeoutError(f"{job_id} did not end: {self.events(job_id)}")

    def wait_terminal(self, job_id: str, timeout: float = 120.0) -> Any:
        """The job's last event, once it has ended."""
        return self.wait_events(job_id, timeout)[-1]
