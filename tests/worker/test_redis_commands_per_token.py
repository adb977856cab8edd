"""Redis commands a real worker spends on a known workload, counted by Redis itself.

The publisher's design fixes what events may cost: per batch one script call, one look at
two keys (EXISTS of the worker's fence flag and of the set of watching streams; no job's
lease or watcher count while both are absent), one tail entry (XADD) and one PUBLISH per client;
per job a log entry (XADD) every ``LOG_MOVE_BATCHES`` batches and when it ends, the
log's expiry with its first move and its last, and its release in the batch that ends it;
no read of the log before a write. Before
the batched script every event cost XREVRANGE + GET + XADD + EXPIRE + PUBLISH inside its
own call; before the tail and reply channels, one XADD and one PUBLISH per event.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable

import pytest
import redis
from helpers.celery_send import send_requests
from helpers.job_log import wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay.keys import Keyspace
from kvrelay.protocol import Finished, GenerateRequest, SamplingOptions, Tokens
from kvrelay_worker.jobs.publisher import LOG_MOVE_BATCHES

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
JOBS = 8
TOKENS = 24
REFRESH_S = 3
REPLY_TO = Keyspace().reply_channel("one-client")


def _calls(client: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(v["calls"])
            for name, v in client.info("commandstats").items()}


def test_event_writes_cost_what_the_design_says(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    # Leases refreshed every 3 s (one GET per job each time), the heartbeat as often.
    worker = start_worker("w", concurrency=JOBS, lease_ttl=30, lease_refresh=REFRESH_S)
    client = redis.Redis.from_url(clean_redis_url)
    try:
        steps_before = int(worker.wait_for_stats(lambda s: True)["steps"])
        before = _calls(client)
        started = time.monotonic()
        requests = [GenerateRequest(job_id=uuid.uuid4().hex, model=MODEL,
                                    prompt_token_ids=[5 + i, 6, 7],
                                    sampling=SamplingOptions(max_tokens=TOKENS, temperature=0.0,
                                                             ignore_eos=True),
                                    enqueued_at=time.time(), reply_to=REPLY_TO)
                    for i in range(JOBS)]
        send_requests(clean_redis_url, requests)
        logs = [wait_terminal(clean_redis_url, r.job_id, 120) for r in requests]
        after = _calls(client)
        elapsed = time.monotonic() - started
        # A heartbeat written after every job ended (an older one may predate the run).
        steps = int(worker.wait_for_stats(lambda s: s.get("jobs", 1) == 0)["steps"]) \
            - steps_before
    finally:
        client.close()
    assert all(isinstance(log[-1], Finished) for log in logs)
    for log in logs:
        assert [e.seq for e in log] == list(range(len(log)))
    events = sum(len(log) for log in logs)
    tokens = sum(len(e.token_ids) for log in logs for e in log if isinstance(e, Tokens))
    assert tokens == JOBS * TOKENS

    def delta(name: str) -> int:
        return after.get(name, 0) - before.get(name, 0)

    # Per batch one tail entry and, all jobs being one client's, one PUBLISH (Celery's
    # broker adds a few of its own); per job a log entry per LOG_MOVE_BATCHES batches and
    # one at its end; the log never read to write it.
    # One EXISTS per publisher batch (at most the engine's steps plus the jobs' Started
    # events; each claim adds two: the job's abort flag, and its end mark, these jobs
    # having no record, sent as they are by a producer other than the SDK), and no job's
    # lease read per batch: the only MGETs are the lease refreshes (all held leases at once).
    refreshes = math.ceil(elapsed / REFRESH_S) + 1
    batches = delta("exists") - 2 * JOBS
    assert 0 < batches <= steps + JOBS
    assert delta("mget") <= refreshes
    moves_per_job = math.ceil(batches / LOG_MOVE_BATCHES) + 1
    assert delta("xadd") <= batches + JOBS * moves_per_job
    assert delta("publish") < batches + JOBS
    assert delta("xrevrange") == 0
    # Far below one XADD and one PUBLISH per event, which this workload would have cost.
    assert delta("xadd") + delta("publish") < events / 2
    # Per job, not per event: GET (the lease read by the claim and the release; the
    # refreshes read all leases with one MGET) and EXPIRE (the record's two, the log's live
    # and ended ones, the tail's with the batch that ends the job).
    assert delta("get") <= 2 * JOBS
    assert delta("expire") <= 5 * JOBS + 1 < events
    # Script calls: a claim per job, one per batch, one per lease refresh (its MGET),
    # and the first call of each of those three scripts twice (the fresh server answers
    # NOSCRIPT, then it is loaded); a job's end is released by the batch that writes it,
    # not by a call of its own (those would add JOBS).
    assert delta("fcall") <= JOBS + batches + delta("mget") + 3
