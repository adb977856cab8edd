"""The one library of every kvrelay script (``kvrelay.redis_functions``): what a worker
and ``kvrelay functions`` load, and what every caller runs by name."""

from __future__ import annotations

from typing import Final

from kvrelay import (
    fresh_scripts,
    job_script_helpers,
    job_scripts,
    lease_scripts,
    log_scripts,
    queue_scripts,
)
from kvrelay.redis_functions import Library

LIBRARY: Final = Library(job_script_helpers.LUA_HELPERS, [
    job_scripts.CLAIM, job_scripts.RELEASE_DONE, lease_scripts.MARK_HANDBACK,
    lease_scripts.RELEASE_HANDBACK, lease_scripts.REFRESH_LEASES, log_scripts.APPEND_EVENT,
    log_scripts.APPEND_BATCH, log_scripts.MOVE_TO_LOG, lease_scripts.CHECK_EXPIRED,
    lease_scripts.COMMIT_REQUEUE, lease_scripts.REREGISTER, lease_scripts.EXPIRED_JOBS,
    job_scripts.RESERVE, job_scripts.UNWATCH, queue_scripts.ADMIT, queue_scripts.MOVE_ORPHANS,
    queue_scripts.RESTORE_DELIVERY, lease_scripts.REARM_QUEUED, fresh_scripts.CHECK_FRESH,
    fresh_scripts.SETTLE_FRESH, queue_scripts.DROP_ENDED_DELIVERY, lease_scripts.REASSERT_END,
])
