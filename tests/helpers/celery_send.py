"""Put jobs on the real queue the way any producer would: Celery ``send_task``, JSON only."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

from celery import Celery

from kvrelay.keys import Keyspace
from kvrelay.protocol import TASK_NAME, GenerateRequest, SamplingOptions, request_to_payload

KEYS = Keyspace()  # the default namespace


def greedy_request(model: str, prompt: list[int], max_tokens: int) -> GenerateRequest:
    return GenerateRequest(job_id=uuid.uuid4().hex, model=model, prompt_token_ids=prompt,
                           sampling=SamplingOptions(max_tokens=max_tokens, temperature=0.0,
                                                    ignore_eos=True),
                           enqueued_at=time.time())


def send_raw(url: str, model: str, tasks: Iterable[tuple[str, list[Any], dict[str, Any]]]
             ) -> None:
    """Send ``(task id, args, kwargs)`` tuples, whatever the args are (fuzzing included)."""
    app = Celery(broker=url)
    app.conf.update(task_serializer="json", accept_content=["json"])
    try:
        for task_id, args, kwargs in tasks:
            app.send_task(TASK_NAME, args=args, kwargs=kwargs, task_id=task_id,
                          queue=KEYS.queue(model))
    finally:
        app.close()


def send_requests(url: str, requests: list[GenerateRequest], copies: int = 1) -> None:
    """Enqueue each request ``copies`` times (same task id: duplicates on purpose)."""
    for request in requests:
        payload = request_to_payload(request)
        send_raw(url, request.model, [(request.job_id, [payload], {})] * copies)
