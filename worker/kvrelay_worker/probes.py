"""What a worker answers to an orchestrator's probes (``/ready``, ``/live`` beside ``/metrics``).

A worker takes no traffic from a load balancer: its readiness says whether it is doing its
job, so that a rollout waits for new workers before it stops old ones and a disruption
budget counts only working pods. Ready: the engine is loaded, Celery consumes the model's
queue, and the worker is not draining. Live: the engine thread, once started, still runs
(a worker whose engine thread died holds its Celery slots forever: restart it); before
the engine starts (waiting for Redis, importing torch, loading weights) the worker is
live, so a long model load never gets it restarted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeAnswer:
    """One probe's verdict and a short reason, for the response body and the logs."""

    ok: bool
    reason: str


class WorkerProbes:
    """Probe state, set by the runtime and the Celery app as the worker moves along."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engine_alive: Callable[[], bool] | None = None
        self._loaded = False
        self._consuming = False
        self._draining = False

    def engine_loaded(self, is_alive: Callable[[], bool]) -> None:
        """The model is loaded and the engine thread steps; ``is_alive`` tells whether
        that thread still runs (a load that fails ends the process instead)."""
        with self._lock:
            self._engine_alive = is_alive
            self._loaded = True

    def consuming(self) -> None:
        """Celery's consumer started on the model's queue (its ``worker_ready``)."""
        with self._lock:
            self._consuming = True

    def draining(self) -> None:
        with self._lock:
            self._draining = True

    def live(self) -> ProbeAnswer:
        with self._lock:
            alive = self._engine_alive
        if alive is None:
            return ProbeAnswer(True, "starting: the model is not loaded yet")
        if alive():
            return ProbeAnswer(True, "the engine thread is running")
        return ProbeAnswer(False, "the engine thread is gone")

    def ready(self) -> ProbeAnswer:
        with self._lock:
            loaded, consuming, draining = self._loaded, self._consuming, self._draining
            alive = self._engine_alive
        if draining:
            return ProbeAnswer(False, "draining")
        if not loaded:
            return ProbeAnswer(False, "loading the model")
        if alive is not None and not alive():
            return ProbeAnswer(False, "the engine thread is gone")
        if not consuming:
            return ProbeAnswer(False, "the model is loaded; the queue's consumer is starting")
        return ProbeAnswer(True, "ready: the model is loaded and its queue consumed")
