"""Sending a copy of a job back to the front of its queue (failover and hand-back), as the
SDK sends it: kombu pops from the right, so the copy is pushed there (RPUSH)."""

from __future__ import annotations

import json

from celery import Celery

from kvrelay.protocol import TASK_NAME
from kvrelay.queue_push import at_front, task_argsrepr


def send_job_copy(app: Celery, queue: str, job_id: str, payload_json: str) -> None:
    """Publish the job under its own id; its prompt stays out of the message headers."""
    with at_front():  # its caller is waiting: the next job a worker pops
        app.send_task(TASK_NAME, args=[json.loads(payload_json)], task_id=job_id, queue=queue,
                      argsrepr=task_argsrepr(job_id), kwargsrepr="{}")
