"""The one library of every kvrelay script (``kvrelay.redis_functions``): what a worker
and ``kvrelay functions`` load, and what every caller runs by name."""

from __future__ import annotations

from typing import Final

from kvrelay import job_scripts, queue_scripts
from kvrelay.redis_functions import Library

LIBRARY: Final = Library(job_scripts.LUA_HELPERS, [
    job_scripts.CLAIM, job_scripts.RELEASE_DONE, job_scripts.MARK_HANDBACK,
    job_scripts.RELEASE_HANDBACK, job_scripts.REFRESH_LEASES, job_scripts.APPEND_EVENT,
    job_scripts.APPEND_BATCH, job_scripts.MOVE_TO_LOG, job_scripts.CHECK_EXPIRED,
    job_scripts.COMMIT_REQUEUE, job_scripts.RESERVE, job_scripts.UNWATCH,
    queue_scripts.ADMIT, queue_scripts.MOVE_ORPHANS,
])
