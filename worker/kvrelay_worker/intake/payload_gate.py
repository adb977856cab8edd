"""Refuse an oversized task message by its raw size, before anything parses it.

Celery's default strategy reads ``message.payload`` first, which JSON-decodes the whole
body: a 100 MiB message would be turned into Python objects (and any nesting depth
tried) before ``decode_payload`` could say it is too large. This strategy wraps the
default one and looks at ``len(message.body)`` (bytes, undecoded) first. Redis's
``proto-max-bulk-len`` bounds the message the transport itself reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from celery.worker.strategy import default

log = logging.getLogger(__name__)

# The task body is ``[args, kwargs, embed]`` around the payload: this much more is let
# through here; ``decode_payload`` then checks the payload's own size exactly.
ENVELOPE_BYTES: Final = 4096

# Called with the task id and the body's size; True when it dealt with the job (its
# ``Failed`` event sent), False when the worker cannot yet (the message goes back).
OnOversized = Callable[[str | None, int], bool]


def size_gated(max_payload_bytes: int, on_oversized: OnOversized) -> Callable[..., Any]:
    """A Celery ``Task.Strategy`` that refuses bodies over the payload limit unparsed."""
    limit = max_payload_bytes + ENVELOPE_BYTES

    def strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
        handle = default(task, app, consumer, **kwargs)
        errors = consumer.connection_errors

        def on_message(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any,
                       **kw: Any) -> Any:
            size = len(message.body)
            if size <= limit:
                return handle(message, body, ack, reject, callbacks, **kw)
            headers = message.headers if isinstance(message.headers, dict) else {}
            job_id = headers.get("id")
            log.warning("refusing job %s: its message is %d bytes (limit %d)",
                        job_id, size, limit)
            if on_oversized(job_id if isinstance(job_id, str) else None, size):
                ack(log, errors)
            else:
                reject(log, errors, requeue=True)
            return None

        return on_message

    return strategy
