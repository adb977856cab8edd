"""The worker writes the replay log exactly as ``kvrelay.event_log`` defines it.

Entry ids, field names, the terminal marker, the result codes (by name) and both expiries
(from the worker's settings) are checked against a real Redis; a source scan checks that
nothing outside that module spells the format out again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kvrelay import event_log
from kvrelay.event_frames import unpack_events
from kvrelay.event_log import AppendResult
from kvrelay.keys import Keyspace
from kvrelay.protocol import Finished, Started, Tokens, decode_event
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()  # the default namespace

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(clean_redis_url: str) -> Iterator[JobStore]:
    client = redis.Redis.from_url(clean_redis_url)
    settings = WorkerSettings(redis_url=clean_redis_url, model_name="m", log_ttl=50,
                              log_live_ttl=500)
    yield JobStore(client, settings)
    client.close()


def _own(store: JobStore, job_id: str) -> None:
    store.redis.set(KEYS.lease(job_id), store.worker_id)


def test_entries_have_the_modules_ids_fields_and_expiries(store: JobStore) -> None:
    _own(store, "j")
    log_key = KEYS.event_log("j")
    assert store.append_event("j", Started(seq=0, worker="w"), fenced=True) == 0
    live_ttl = store.redis.ttl(log_key)
    assert 450 < live_ttl <= 500  # KVRELAY_LOG_LIVE_TTL, not a number in the script
    assert store.append_event("j", Tokens(seq=1, token_ids=[3], text="x"), fenced=True) == 1
    assert store.append_event("j", Finished(seq=2, finish_reason="stop"), fenced=True) == 2
    assert 0 < store.redis.ttl(log_key) <= 50  # KVRELAY_LOG_TTL once it ended

    entries = store.redis.xrange(log_key)
    assert [e[0].decode() for e in entries] == [event_log.entry_id(s) for s in (0, 1, 2)]
    field, marker = event_log.EVENT_FIELD.encode(), event_log.TERMINAL_FIELD.encode()
    run = event_log.RUN_FIELD.encode()
    assert [sorted(fields) for _, fields in entries] == [[field, run], [field, run],
                                                         [field, run, marker]]
    # Each entry names the run that wrote it (fenced by the worker's id here).
    assert [event_log.entry_run(fields) for _, fields in entries] == [store.worker_id] * 3
    assert [[decode_event(bytes(raw)).seq for raw in unpack_events(event_log.entry_events(f) or b"")]
            for _, f in entries] == [[0], [1], [2]]


def test_refused_writes_answer_with_named_codes(store: JobStore) -> None:
    _own(store, "j")
    assert store.append_event("j", Started(seq=0, worker="w"), fenced=True) == 0
    # The same seq again (a retried batch): named, not a Redis error text to match.
    again = store.append_events([("j", Started(seq=0, worker="w"))], fenced=True)
    assert again == [AppendResult.ALREADY_WRITTEN]
    store.redis.set(KEYS.lease("j"), "someone-else")
    assert store.append_event("j", Tokens(seq=1, token_ids=[1], text="a"), fenced=True) == \
        AppendResult.FENCED
    assert store.append_event("j", Tokens(seq=5, token_ids=[1], text="a"), fenced=False) == \
        AppendResult.NOT_NEXT
    assert store.append_event("j", Finished(seq=1, finish_reason="stop"), fenced=False) == 1
    assert store.append_unowned("j", Finished(seq=0, finish_reason="stop")) == \
        AppendResult.ENDED


def _sources(*folders: str) -> list[Path]:
    return [p for folder in folders for p in (ROOT / folder).rglob("*.py")]


def test_the_format_is_spelled_out_in_one_module() -> None:
    home = ROOT / "client" / "kvrelay" / "event_log.py"
    writes = re.compile(r"\.xadd\(|'XADD'|\"XADD\"")
    writers = [p for p in _sources("client", "worker", "tests", "benchmarks")
               if writes.search(p.read_text()) and p not in (home, Path(__file__).resolve())]
    # The Lua scripts write too, but with names formatted in from ``event_log``.
    scripts = ["client/kvrelay/job_script_helpers.py", "client/kvrelay/log_scripts.py"]
    assert sorted(p.relative_to(ROOT).as_posix() for p in writers) == scripts
    for name in scripts:
        script = (ROOT / name).read_text()
        for spelled_out in ("86400", "'e'", "-1'"):
            assert spelled_out not in script, (name, spelled_out)
    fakes = [ROOT / "tests" / "helpers" / "fake_worker.py",
             ROOT / "benchmarks" / "client_streams.py"]
    for fake in fakes:
        assert re.search(r"from kvrelay import .*\bevent_log\b", fake.read_text()), fake


def test_tail_records_read_back_and_a_cut_short_entry_is_a_value_error() -> None:
    """A damaged tail entry reads as missing (``read_after`` skips a ``ValueError``), never
    as an error of another type that would end the reader's stream."""
    blob = (event_log.tail_record("a", 3, b"\x91\x01", ended=False)
            + event_log.tail_record("b", 7, b"\x90", ended=True))
    assert list(event_log.tail_records(blob)) == [("a", 3, False, b"\x91\x01"),
                                                   ("b", 7, True, b"\x90")]
    for cut in (1, 4, len(blob) - 1):
        with pytest.raises(ValueError):
            list(event_log.tail_records(blob[:cut]))
