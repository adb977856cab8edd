"""The job store's lease calls: keeping the leases of held jobs, registering again the
jobs whose record Redis lost, handing a job back, finding and taking over the jobs
whose lease ran out (``kvrelay.lease_scripts``). Every expiry is judged on Redis's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvrelay import event_log, fresh_scripts, lease_scripts
from kvrelay_worker.jobs.store_calls import StoreCalls, text

# ``REFRESH_LEASES``'s per-job code bits.
_HELD, _ABORTED, _VANISHED = 1, 2, 4


@dataclass
class LeaseRefresh:
    """What one refresh found: jobs whose lease another run holds now, jobs whose abort
    flag is set, and jobs whose record is gone (Redis lost its keys)."""

    lost: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)


class LeaseOps(StoreCalls):
    """Lease upkeep and failover, over ``StoreCalls``."""

    def mark_handback(self, job_id: str, run: str = "") -> bool:
        return bool(self._one(lease_scripts.MARK_HANDBACK,
                              [self.keys.job_record(job_id), self.keys.lease(job_id),
                               self.running_key],
                              [run or self.worker_id, job_id]))

    @property
    def claim_due_ms(self) -> int:
        """How long after a job is set ``queued`` its copy should have been claimed: then
        the watch looks for the copy (``lease_scripts.REARM_QUEUED``)."""
        return self.lease_ms

    @property
    def marker_ms(self) -> int:
        """How long the marker lets one watch at a time act on a job (its requeue or its
        lost message): two leases, at least 10 s."""
        return max(self.lease_ms * 2, 10_000)

    def release_handback(self, job_id: str, run: str = "") -> bool:
        return bool(self._one(
            lease_scripts.RELEASE_HANDBACK,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key],
            [job_id, run or self.worker_id, self.claim_due_ms],
        ))

    def refresh_held(self, job_ids: list[str], runs: Sequence[str] | None = None
                     ) -> LeaseRefresh:
        """Extend the leases of the runs this worker holds (``runs``, per job; default:
        the worker's id), in one script call. A lease that expired while Redis was out
        of reach is taken again if no other run claimed the job since; a job whose
        record is gone is reported ``vanished`` (see ``reregister``)."""
        found = LeaseRefresh()
        if not job_ids:
            return found
        key_list = [self.running_key]
        args: list[Any] = [self.lease_ms]
        for job_id, run in zip(job_ids, runs or [self.worker_id] * len(job_ids), strict=True):
            key_list += [self.keys.lease(job_id), self.keys.abort_flag(job_id),
                         self.keys.job_record(job_id)]
            args += [job_id, run]
        codes = self._one(lease_scripts.REFRESH_LEASES, key_list, args)
        for job_id, raw in zip(job_ids, codes, strict=True):
            code = int(raw)
            if code & _VANISHED:
                found.vanished.append(job_id)
            elif not code & _HELD:
                found.lost.append(job_id)
            if code & _ABORTED:
                found.aborted.append(job_id)
        return found

    def refresh_leases(self, job_ids: list[str], runs: Sequence[str] | None = None
                       ) -> tuple[list[str], list[str]]:
        """``refresh_held``'s jobs whose lease another run owns now, and those whose
        abort flag is set."""
        found = self.refresh_held(job_ids, runs)
        return found.lost, found.aborted

    def reregister(self, job_id: str, run: str, payload_json: str, digest: str,
                   attempt: int) -> bool:
        """Record again a held job whose record Redis lost (restarted without
        persistence), as this run's, running; False when that is not why it is gone
        (``lease_scripts.REREGISTER``)."""
        return bool(self._one(
            lease_scripts.REREGISTER,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key,
             self.fence_key],
            [job_id, self.worker_id, run or self.worker_id, payload_json, digest, attempt,
             self.lease_ms, self.live_ttl_s],
        ))

    def expired_candidates(self, limit: int = 100) -> list[str]:
        """Jobs of this model whose lease expiry (as last refreshed) has passed, by
        Redis's clock."""
        ids = self._one(lease_scripts.EXPIRED_JOBS, [self.running_key], [limit])
        return [text(i) for i in ids]

    def check_expired(self, job_id: str) -> tuple[str, str | None, str]:
        """(status, payload, the run that lost its lease: '' unless requeued)."""
        result = self._one(
            lease_scripts.CHECK_EXPIRED,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key,
             self.keys.requeue_marker(job_id)],
            [job_id, self.settings.max_attempts, self.marker_ms,
             self.ended_ttl_s, self.fence_prefix],
        )
        status = text(result[0])
        payload = text(result[1]) if len(result) > 1 and result[1] else None
        lost_run = text(result[2]) if len(result) > 2 else ""
        return status, payload, lost_run

    def commit_requeue(self, job_id: str, lost_run: str = "") -> None:
        self._one(
            lease_scripts.COMMIT_REQUEUE,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key,
             self.keys.requeue_marker(job_id)],
            [job_id, lost_run, self.claim_due_ms, self.fence_prefix],
        )

    def rearm_queued(self, job_id: str) -> bool:
        """A job left ``queued`` is due again later (its copy was looked for, and pushed
        where there was none); False when it was claimed or ended meanwhile."""
        return bool(self._one(
            lease_scripts.REARM_QUEUED,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key,
             self.keys.requeue_marker(job_id)],
            [job_id, self.claim_due_ms],
        ))

    def picked_in_time(self, job_id: str) -> bool:
        """Whether a dead worker took the job's message before its queue deadline
        (``event_log.PICKED_FIELD``): its next pickup is not refused as late."""
        return self.redis.hget(self.keys.job_record(job_id), event_log.PICKED_FIELD) is not None

    # ------------------------------------------------------------ jobs never claimed

    def due_fresh(self, limit: int) -> list[str]:
        """Admitted jobs of this model whose message the watch should look for now."""
        return [text(i) for i in self._one(lease_scripts.EXPIRED_JOBS, [self.fresh_key],
                                           [limit])]

    def _fresh_keys(self, job_id: str) -> list[str]:
        return [self.keys.job_record(job_id), self.keys.lease(job_id), self.fresh_key,
                self.keys.requeue_marker(job_id)]

    def check_fresh(self, job_id: str) -> tuple[str, str, int]:
        """(``gone``/``busy``/``due``, its message when due, how often it was looked
        for) (``fresh_scripts.CHECK_FRESH``)."""
        found = self._one(fresh_scripts.CHECK_FRESH, self._fresh_keys(job_id),
                          [job_id, self.marker_ms])
        if text(found[0]) != "due":
            return text(found[0]), "", 0
        return "due", text(found[1]), int(found[2])

    def settle_fresh(self, job_id: str, copy: str, wait_ms: int, picked: bool,
                     target: str) -> int:
        """Due again in ``wait_ms``, with ``copy`` pushed to ``target`` unless '';
        ``fresh_scripts.SETTLE_FRESH``'s answer."""
        return int(self._one(fresh_scripts.SETTLE_FRESH, [*self._fresh_keys(job_id), target],
                             [job_id, copy, wait_ms, 1 if picked else 0]))

    def reassert_end(self, job_id: str, run: str, lost: bool = False) -> int:
        """Write again that ``run`` ended the job (``lease_scripts.REASSERT_END``'s answer);
        ``lost``: its record was still to live when the outage began (a missing one was
        lost, not expired)."""
        return int(self._one(lease_scripts.REASSERT_END,
                             [self.keys.job_record(job_id), self.keys.lease(job_id),
                              self.running_key, self.fresh_key],
                             [job_id, run or self.worker_id, self.ended_ttl_s,
                              1 if lost else 0]))
