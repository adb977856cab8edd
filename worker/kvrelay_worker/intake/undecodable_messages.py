"""Messages Celery cannot decode still end their job with a ``Failed`` event.

A message whose content type the worker does not accept (pickle, YAML, ...) or whose body
does not parse is dropped by Celery's consumer before any task runs: by default with a
log line only, and its caller waits for ``stream_timeout``. This consumer reads the job id
from the message headers (Celery's protocol 2 puts the task id there; task id = job id),
fails that job as ``invalid_request`` and counts the message as a rejected job; a message
with no readable id is still counted. The message is then acknowledged as Celery does,
never decoded.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker.consumer import Consumer

log = logging.getLogger(__name__)


def job_id_of(message: Any) -> str | None:
    """The task id in an undecoded message's headers, when it is a plausible job id."""
    headers = getattr(message, "headers", None)
    job_id = headers.get("id") if isinstance(headers, dict) else None
    return job_id if isinstance(job_id, str) and job_id else None


class KvrelayConsumer(Consumer):
    """Celery's consumer, with a ``Failed`` event for every job it cannot decode."""

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        # A message without Celery's task headers whose body does not decode.
        _fail(message, exc)
        super().on_decode_error(message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        # A task message whose content type is refused (pickle) or whose fields are invalid.
        _fail(message, exc)
        super().on_invalid_task(body, message, exc)


def _fail(message: Any, exc: Exception) -> None:
    from kvrelay_worker.app import current_runtime

    runtime = current_runtime()
    if runtime is None:
        return
    content_type = getattr(message, "content_type", None) or "untyped"
    reason = (
        f"the worker cannot decode a {content_type} message ({type(exc).__name__}); "
        "requests travel as JSON"
    )
    try:
        runtime.reject(job_id_of(message), reason)
    except Exception:  # Redis trouble: Celery's own handling still runs
        log.exception("could not fail an undecodable job")
