"""The record of a running ``kvrelay up --serve`` stack, so other shells find its Redis.

``up --serve`` writes ``<run dir>/stack.json`` (Redis URL, model, its pid) and removes it
when it stops. ``generate`` and ``chat`` read it when no Redis URL was given, and ignore a
record whose process is gone (a stack killed with SIGKILL cannot remove its record).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kvrelay.cli.config import env_value

RECORD_FILE = "stack.json"


def run_dir() -> Path:
    """``$KVRELAY_RUN_DIR``, else ``<KVRELAY_CACHE_DIR or ~/.cache/kvrelay>/run``."""
    configured = env_value("RUN_DIR")
    if configured:
        return Path(configured).expanduser()
    cache = env_value("CACHE_DIR")
    root = Path(cache).expanduser() if cache else Path.home() / ".cache" / "kvrelay"
    return root / "run"


@dataclass(frozen=True)
class StackRecord:
    redis_url: str
    model: str
    pid: int
    started_at: float


def write_record(redis_url: str, model: str) -> Path:
    """Record this process's stack (atomically: readers never see half a file)."""
    folder = run_dir()
    folder.mkdir(parents=True, exist_ok=True)
    record = StackRecord(redis_url, model, os.getpid(), time.time())
    path = folder / RECORD_FILE
    tmp = folder / f".{RECORD_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(record)) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_live_record() -> StackRecord | None:
    """The recorded stack if its process still runs, else None."""
    path = run_dir() / RECORD_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        record = StackRecord(
            str(data["redis_url"]), str(data["model"]), int(data["pid"]), float(data["started_at"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if _alive(record.pid) else None


def remove_record() -> None:
    """Remove the record if it is this process's (a newer stack may have replaced it)."""
    path = run_dir() / RECORD_FILE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if int(json.loads(path.read_text(encoding="utf-8"))["pid"]) == os.getpid():
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
