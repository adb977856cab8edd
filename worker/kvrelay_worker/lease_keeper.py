"""Lease upkeep for the jobs this worker holds, once per ``lease_refresh``.

Extends the lease of every held job; a job whose lease was taken is fenced (another
worker owns it now); a job whose abort flag is set is aborted (in case the control
message was missed). Taking over other workers' jobs is ``failover``'s business.
"""

from __future__ import annotations

from kvrelay_worker.job_store import JobStore
from kvrelay_worker.owned_jobs import OwnedJobs
from kvrelay_worker.periodic import Periodic
from kvrelay_worker.settings import WorkerSettings


class LeaseKeeper:
    def __init__(self, store: JobStore, settings: WorkerSettings, jobs: OwnedJobs) -> None:
        self.store = store
        self.jobs = jobs
        self._thread = Periodic("kvrelay-leases", settings.lease_refresh, self.refresh)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def refresh(self) -> None:
        lost, aborted = self.store.refresh_leases(self.jobs.ids())
        for job_id in lost:
            self.jobs.fence(job_id)
        for job_id in aborted:
            self.jobs.abort(job_id)
