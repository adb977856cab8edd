"""The replay log is capped in bytes as well as in entries: the oldest entries go first.

An entry holds the events of up to ``LOG_MOVE_BATCHES`` publisher batches (they move from
the worker's tail into the log together). Fails on the code before the fix (only
``MAXLEN`` entries bounded the log).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from kvrelay import event_log
from kvrelay.event_frames import unpack_events
from kvrelay.keys import Keyspace
from kvrelay.protocol import GenerateRequest, Tokens, decode_event
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.jobs.active_job import ActiveJob
from kvrelay_worker.jobs.job_store import JobStore, PriorProgress
from kvrelay_worker.jobs.log_window import LogWindow
from kvrelay_worker.jobs.publisher import LOG_MOVE_BATCHES, EventItem, Publisher
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()  # the default namespace

MAX_BYTES = 12_000  # two entries of this test (48 events of ~108 bytes each)


@pytest.fixture
def store(clean_redis_url: str) -> Iterator[JobStore]:
    client = redis.Redis.from_url(clean_redis_url)
    yield JobStore(client, WorkerSettings(redis_url=clean_redis_url, model_name="m",
                                          log_max_bytes=MAX_BYTES))
    client.close()


def _log(store: JobStore, job_id: str) -> list[tuple[list[int], bytes]]:
    """(its events' seqs, its events array) per log entry."""
    entries = []
    for _entry_id, fields in store.redis.xrange(KEYS.event_log(job_id)):
        data = event_log.entry_events(fields) or b""
        entries.append(([decode_event(bytes(raw)).seq for raw in unpack_events(data)], data))
    return entries


def test_the_publisher_keeps_the_log_under_its_byte_cap(store: JobStore) -> None:
    request = GenerateRequest(job_id="j", model="m", prompt_token_ids=[1])
    job = ActiveJob(job_id="j", request=request, payload_json="{}",
                    params=SamplingParams(max_tokens=100), prompt_ids=[1], attempt=1,
                    prior=PriorProgress())
    store.redis.set(KEYS.lease("j"), store.worker_id)
    publisher = Publisher(store, WorkerMetrics("m"), requeue=lambda job_id, payload: None,
                          on_fenced=lambda job: None)
    batches = LOG_MOVE_BATCHES * 6
    for i in range(0, 3 * batches, 3):  # batches of three events, one round trip each
        publisher._process([EventItem(job, Tokens(seq=0, token_ids=[n],
                                                  text=f"<{n:03d}>", index=n % 2))
                            for n in range(i, i + 3)])
    entries = _log(store, "j")
    sizes = [len(data) for _, data in entries]
    assert sum(sizes) <= MAX_BYTES
    seqs = [seq for entry_seqs, _ in entries for seq in entry_seqs]
    last_moved = 3 * (batches - batches % LOG_MOVE_BATCHES) - 1
    assert seqs[-1] == last_moved  # the newest entry is always there...
    assert seqs == list(range(seqs[0], last_moved + 1))  # ...after a contiguous run
    assert seqs[0] > 0  # and the oldest went
    assert sum(sizes) + max(sizes) > MAX_BYTES  # no more than needed


def test_the_window_counts_what_the_claim_read_and_keeps_the_newest() -> None:
    window = LogWindow(100, [(0, 40), (1, 40)])
    assert window.add(2, 10) == 0
    assert window.add(3, 30) == 1  # 0 goes: 40 + 10 + 30 <= 100
    assert window.add(4, 500) == 4  # a single entry over the cap still stays
