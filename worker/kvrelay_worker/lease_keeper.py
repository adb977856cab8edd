"""Background upkeep: refresh leases, notice aborts, announce the worker, take over jobs.

Once per ``lease_refresh``: extend the lease of every job this worker holds (a job whose
lease was taken is dropped here: another worker owns it now), abort jobs whose abort
flag is set (in case the control message was missed), and write the heartbeat. Once per
``watchdog_interval``: look for jobs of this model whose owner stopped refreshing, and
requeue each (exactly one live worker wins each job) so a worker death costs about one
lease period, not Celery's visibility timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kvrelay.protocol import ErrorCode, Failed, WorkerInfo, encode_worker_info
from kvrelay_worker.job_store import JobStore
from kvrelay_worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, store: JobStore, settings: WorkerSettings,
                 owned_jobs: Callable[[], list[str]],
                 on_lost: Callable[[str], None],
                 on_aborted: Callable[[str], None],
                 requeue: Callable[[str, str], None],
                 worker_info: Callable[[], WorkerInfo]) -> None:
        self.store = store
        self.settings = settings
        self.owned_jobs = owned_jobs
        self.on_lost = on_lost
        self.on_aborted = on_aborted
        self.requeue = requeue
        self.worker_info = worker_info
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvrelay-leases", daemon=True)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        try:
            pipe = self.store.redis.pipeline(transaction=False)
            pipe.delete(self.settings.keys.worker_heartbeat(self.settings.worker_id))
            pipe.srem(self.settings.keys.workers, self.settings.worker_id)
            pipe.execute()
        except Exception:
            log.warning("could not remove the worker's heartbeat on shutdown")

    def _run(self) -> None:
        period = min(self.settings.lease_refresh, self.settings.watchdog_interval)
        next_watch = time.monotonic()
        while not self._stop.wait(period):
            try:
                self.refresh()
                self.beat()
                if time.monotonic() >= next_watch:
                    next_watch = time.monotonic() + self.settings.watchdog_interval
                    self.take_over_expired()
            except Exception as exc:
                log.warning("lease upkeep failed (%s); retrying", exc)

    def refresh(self) -> None:
        jobs = self.owned_jobs()
        for job_id, kept in self.store.refresh_leases(jobs).items():
            if not kept:
                self.on_lost(job_id)
        for job_id in self.store.aborted(jobs):
            self.on_aborted(job_id)

    def beat(self) -> None:
        info = self.worker_info()
        ttl_ms = int(max(3.0, 3 * self.settings.lease_refresh) * 1000)
        pipe = self.store.redis.pipeline(transaction=False)
        pipe.set(self.settings.keys.worker_heartbeat(self.settings.worker_id), encode_worker_info(info),
                 px=ttl_ms)
        pipe.sadd(self.settings.keys.workers, self.settings.worker_id)
        pipe.execute()

    def take_over_expired(self) -> None:
        """Requeue jobs of dead workers (each claimed atomically, so only one requeues it)."""
        for job_id in self.store.expired_candidates():
            status, payload = self.store.check_expired(job_id)
            if status == "requeue" and payload is not None:
                log.warning("job %s lost its worker; requeueing it", job_id)
                self.requeue(job_id, payload)
                self.store.commit_requeue(job_id)
            elif status == "exhausted":
                log.warning("job %s lost %d workers; failing it", job_id,
                            self.settings.max_attempts)
                self.store.append_unowned(job_id, Failed(
                    seq=0, code=ErrorCode.WORKER_LOST,
                    message=f"workers died {self.settings.max_attempts} times while running "
                            f"this job",
                ))
