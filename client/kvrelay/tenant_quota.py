"""One tenant's share of a namespace's workers, counted in Redis by the admission script.

The gateway turns a tenant's policy into a ``TenantQuota`` and sets it on the tenant's
streams (``AsyncStream.set_quota``). The admission script (``kvrelay.queue_push``) then
checks and counts, in the same call that pushes the job, the tenant's jobs in flight
(``Keyspace.tenant_jobs``), its jobs not yet started (``Keyspace.tenant_queued``) and a
token bucket of admissions per second (``Keyspace.tenant_rate``): gateways racing each
other can never let a tenant past its limits. A job leaves the counts when its stream
sees it start (queued) or end (both); entries also expire at the job's deadline, so a
gateway that dies leaves nothing counted for longer than its jobs could have run.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass
from typing import Final

# How long an entry counts when its job has no deadline of its own.
UNBOUNDED_JOB_S: Final = 86_400.0


@dataclass(frozen=True)
class TenantQuota:
    """Args:
    tenant: the tenant's name (its counts live under it, in the client's namespace).
    max_jobs: its jobs admitted and not ended, at most (None: no limit).
    max_queued: its jobs admitted and not started by a worker, at most (None: no limit).
    requests_per_second: admissions per second, sustained (None: no limit).
    burst: admissions the bucket holds (at least 1).
    """

    tenant: str
    max_jobs: int | None = None
    max_queued: int | None = None
    requests_per_second: float | None = None
    burst: int = 1

    def script_args(self) -> list[str]:
        """ARGV for the admission script's tenant part ('' = no limit)."""
        return ["" if self.max_jobs is None else str(self.max_jobs),
                "" if self.max_queued is None else str(self.max_queued),
                "" if self.requests_per_second is None else repr(float(self.requests_per_second)),
                str(max(1, self.burst))]


def retry_after_for_rate(wait_s: float) -> float:
    """A whole number of seconds to wait for the next token (at least one)."""
    return float(max(1, math.ceil(wait_s)))


# The quota of the job being enqueued on this task: set by the stream around its enqueue,
# read by the Celery enqueuer on the loop (a context variable, so that the enqueuer's
# signature, which tests replace, stays one request in, nothing out).
current_quota: contextvars.ContextVar[tuple[TenantQuota, float] | None] = \
    contextvars.ContextVar("kvrelay_tenant_quota", default=None)
