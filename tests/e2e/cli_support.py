"""Running ``kvrelay`` as a real process in tests, and proving it left nothing behind.

Every process a test starts carries ``KVRELAY_TEST_MARKER=<unique>`` in its environment,
and so do its children and theirs (Redis, workers): ``leftovers(marker)`` finds any of
them still alive, wherever they were re-parented, and ``kill_marked`` ends them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import redis

KVRELAY = [sys.executable, "-m", "kvrelay.cli"]
MARKER = "KVRELAY_TEST_MARKER"
# Databases of the session Redis used by these tests (others use their own numbers).
CLI_DB = 12
STACK_DB = 13


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a ``kvrelay`` under test: none of the caller's kvrelay settings
    (the model cache excepted), a private run folder, a unique marker."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("KVRELAY_") or name == "KVRELAY_CACHE_DIR"
    }
    env.update(
        KVRELAY_RUN_DIR=str(tmp_path / "run"),
        TMPDIR=str(tmp_path),
        PYTHONUNBUFFERED="1",
        COLUMNS="200",
    )
    env[MARKER] = uuid.uuid4().hex
    env.update(extra)
    return env


def leftovers(marker: str) -> list[str]:
    """``pid cmdline`` of every live process whose environment carries ``marker``."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if process.pid == os.getpid() or process.status() == psutil.STATUS_ZOMBIE:
                continue
            if process.environ().get(MARKER) == marker:
                found.append(f"{process.pid} {' '.join(process.info['cmdline'] or [])}")
    return found


def wait_no_leftovers(marker: str, timeout: float = 15.0) -> list[str]:
    """Leftovers still there after ``timeout`` seconds (a dying process takes a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        found = leftovers(marker)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def kill_marked(marker: str) -> None:
    """SIGKILL every process carrying ``marker`` (test cleanup: all of them are ours)."""
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.pid != os.getpid() and process.environ().get(MARKER) == marker:
                process.kill()


def one_line_error(stderr: str) -> str:
    """The only non-empty stderr line, checked to be an error and not a traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert lines, "nothing on stderr"
    error_lines = [line for line in lines if ": error: " in line]
    assert len(error_lines) == 1, stderr
    return error_lines[0]


def run_cli(
    args: Sequence[str], env: dict[str, str], *, timeout: float = 120.0, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``kvrelay ARGS`` to the end (killed, with everything it started, on timeout)."""
    process = subprocess.Popen(
        [*KVRELAY, *args],
        env=env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_marked(env[MARKER])
        out, err = process.communicate()
        pytest.fail(f"kvrelay {' '.join(args)} ran past {timeout}s\n{out}\n{err}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@dataclass
class CliProcess:
    """A ``kvrelay`` process running in the background, its output in files."""

    process: subprocess.Popen[bytes]
    out_path: Path
    err_path: Path
    env: dict[str, str]

    @classmethod
    def start(cls, args: Sequence[str], env: dict[str, str], folder: Path) -> CliProcess:
        folder.mkdir(parents=True, exist_ok=True)
        out_path, err_path = folder / "stdout.txt", folder / "stderr.txt"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            process = subprocess.Popen(
                [*KVRELAY, *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        return cls(process, out_path, err_path, env)

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_for(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.process.poll() is not None:
                pytest.fail(f"kvrelay exited ({self.process.returncode}) before {what}:\n"
                            f"{self.stdout}\n{self.stderr}")  # fmt: skip
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout}s:\n{self.stdout}\n{self.stderr}")
            time.sleep(0.2)

    def send(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cleanup()
            pytest.fail(f"kvrelay did not exit within {timeout}s:\n{self.stderr}")

    def cleanup(self) -> None:
        """Kill it and everything it started (idempotent)."""
        kill_marked(self.env[MARKER])
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


@contextlib.contextmanager
def background_cli(args: Sequence[str], env: dict[str, str], folder: Path) -> Iterator[CliProcess]:
    cli = CliProcess.start(args, env, folder)
    try:
        yield cli
    finally:
        cli.cleanup()


def live_models(url: str) -> set[str]:
    """Models announced by live workers on ``url`` (plain redis-py: no client threads)."""
    from kvrelay.keys import Keyspace

    KEYS = Keyspace()
    from kvrelay.protocol import decode_worker_info

    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        models = set()
        for worker_id in client.smembers(KEYS.workers):
            raw = client.get(KEYS.worker_heartbeat(worker_id.decode()))
            if raw is not None:
                models.add(decode_worker_info(raw).model)
        return models
    except redis.RedisError:
        return set()
    finally:
        client.close()


def announce(url: str, model: str, worker_id: str = "fake-cli-worker", ttl_s: int = 600) -> None:
    """Register a (fake) live worker for ``model`` as a real one does: heartbeat, then SADD."""
    from kvrelay.keys import Keyspace

    KEYS = Keyspace()
    from kvrelay.protocol import WorkerInfo, encode_worker_info

    info = WorkerInfo(
        worker_id=worker_id, model=model, host="test-host", pid=os.getpid(), updated_at=time.time()
    )
    client = redis.Redis.from_url(url)
    try:
        client.set(KEYS.worker_heartbeat(worker_id), encode_worker_info(info), ex=ttl_s)
        client.sadd(KEYS.workers, worker_id)
    finally:
        client.close()
