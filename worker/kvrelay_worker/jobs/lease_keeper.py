"""Lease upkeep for the jobs this worker holds, once per ``lease_refresh``.

Extends the lease of every held job's run; a job whose lease was taken is fenced (another
run owns it now); a job whose abort flag is set is aborted (in case the control message
was missed). A lease that ran out while Redis was out of reach is taken back (if nobody
claimed the job meanwhile): after a failed refresh the next comes a fifth of a period
later, so an owner is back before any watcher judges its leases. Taking over other
workers' jobs is ``failover``'s business.
"""

from __future__ import annotations

import time

from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.jobs.owned_jobs import OwnedJobs
from kvrelay_worker.periodic import Periodic
from kvrelay_worker.redis_health import RedisHealth
from kvrelay_worker.settings import WorkerSettings


class LeaseKeeper:
    def __init__(self, store: JobStore, settings: WorkerSettings, jobs: OwnedJobs,
                 health: RedisHealth | None = None) -> None:
        self.store = store
        self.jobs = jobs
        self.health = health
        self.period = settings.lease_refresh
        self._thread = Periodic("kvrelay-leases", self.period / 5, self._tick)
        self._next_at = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def _tick(self) -> None:
        """Refresh once a period, or at the next tick after a failed refresh."""
        now = time.monotonic()
        if now < self._next_at:
            return
        try:
            self.refresh()
        except Exception:
            if self.health is not None:
                self.health.failed()
            raise
        self._next_at = now + self.period

    def refresh(self) -> None:
        held = self.jobs.jobs()
        lost, aborted = self.store.refresh_leases([job.job_id for job in held],
                                                  [job.run_id or self.store.worker_id
                                                   for job in held])
        for job_id in lost:
            self.jobs.fence(job_id)
        for job_id in aborted:
            self.jobs.abort(job_id)
