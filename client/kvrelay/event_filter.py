"""Events that no worker of a job can have sent, recognised so that a stream drops them
instead of buffering, waiting for or looping on them (anyone who may PUBLISH on a job's
channel can send anything)."""

from __future__ import annotations

import logging
from typing import Final

from kvrelay.protocol import Tokens

log = logging.getLogger("kvrelay.stream")

# A live event further ahead of the next expected seq than this is not buffered: pub/sub
# delivers in order and every earlier event is in the log, so no worker sent it (a real
# one lost with a dropped connection is read back from the log when the gap is noticed).
MAX_SEQ_AHEAD: Final = 10_000
# The choice indexes a resumed stream accepts (it does not know the request's ``n``).
MAX_CHOICES_UNKNOWN_N: Final = 1024
# Impossible events logged per stream (the rest are only counted).
_LOGGED: Final = 3


class ImpossibleEvents:
    """One stream's filter: a choice index >= n, or a live seq far ahead, is impossible."""

    __slots__ = ("_job_id", "_max_choices", "count")

    def __init__(self, job_id: str, n: int | None) -> None:
        self._job_id = job_id
        self._max_choices = MAX_CHOICES_UNKNOWN_N if n is None else n
        self.count = 0

    def rejects(self, event: object, *, next_seq: int, live: bool) -> bool:
        """True (and counted) for an event no worker of this job sent."""
        seq = getattr(event, "seq", next_seq)
        if live and seq > next_seq + MAX_SEQ_AHEAD:
            reason = f"seq {seq} is far ahead of the next expected, {next_seq}"
        elif type(event) is Tokens and not 0 <= event.index < self._max_choices:
            reason = f"choice index {event.index} of a job with {self._max_choices} choices"
        else:
            return False
        self.count += 1
        if self.count <= _LOGGED:
            log.warning("ignoring an impossible event of job %s: %s", self._job_id, reason)
        return True
