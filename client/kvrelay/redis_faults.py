"""Which Redis errors are a passing state of the server rather than a fault of the call.

A write Redis refuses is not written, whatever the reason: a replica that stopped
acknowledging (``NOREPLICAS`` under ``min-replicas-to-write``), a failed snapshot
(``MISCONF``), a long script (``BUSY``), a primary turned replica (``READONLY``), no
memory (``OOM``), a server still loading (``LOADING``), a failover in progress
(``MASTERDOWN``, ``TRYAGAIN``), an ACL change (``NOPERM``). Each passes when an operator
or Sentinel acts, so a caller that must not lose the write holds it and tries again;
so does a caller whose connection broke or timed out. Only what is left (a malformed
call, a script's own bug) is a fault to report.
"""

from __future__ import annotations

import re
from typing import Final

import redis

__all__ = ["REFUSAL_CODES", "WritesRefused", "is_refusal", "is_transient"]

# Error codes (the reply's first word) of a server that refuses for now.
REFUSAL_CODES: Final = frozenset({
    "NOREPLICAS", "MISCONF", "BUSY", "READONLY", "OOM", "LOADING", "MASTERDOWN",
    "TRYAGAIN", "NOPERM", "CLUSTERDOWN", "NOTBUSY", "UNBLOCKED",
})


class WritesRefused(redis.ConnectionError):
    """Redis refused a call for as long as its caller would wait (``patiently``): the
    server is up but will not write for now, which a caller handles as it handles a
    server out of reach (the SDK raises ``BrokerUnavailable``)."""


# Upper-case words of an error's text, wherever redis-py or a script's wrapping put them.
_CODE_WORDS: Final = re.compile(r"\b[A-Z]+\b")


def is_refusal(exc: BaseException) -> bool:
    """An error reply that says the server refused for now (its code may also come
    inside a script's error text, as Redis 6 words a refused ``redis.call``)."""
    # redis-py drops the code from the replies it has a class for.
    if isinstance(exc, (redis.ReadOnlyError, redis.OutOfMemoryError, redis.BusyLoadingError,
                        redis.exceptions.NoPermissionError)):
        return True
    if not isinstance(exc, redis.ResponseError):
        return False
    return any(word in REFUSAL_CODES for word in _CODE_WORDS.findall(str(exc)))


def is_transient(exc: BaseException) -> bool:
    """Unreachable, timed out, or refused for now: the same call may succeed later."""
    return isinstance(exc, (redis.ConnectionError, redis.TimeoutError)) or is_refusal(exc)
