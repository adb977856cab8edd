"""A download shows huggingface_hub's progress bar when stderr is a terminal, and none with
``HF_HUB_DISABLE_PROGRESS_BARS=1`` (nor in a log file: test_hub_download checks that)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from helpers.hub_fixtures import REPO, HubRepos

FETCH = f"from kvrelay_worker.loading import fetch_repo; fetch_repo({REPO!r}, ['config.json'])"


def _stderr_on_a_terminal(env: dict[str, str]) -> str:
    """Run FETCH in a child whose stderr is a pseudo-terminal; what it wrote there."""
    master, slave = pty.openpty()
    # A terminal 120 columns wide (a new one has none, and tqdm then draws an empty bar).
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    try:
        child = subprocess.Popen([sys.executable, "-c", FETCH], env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # the child closed the terminal (EIO on Linux)
                break
            if not data:
                break
            chunks.append(data)
        assert child.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("disabled", [False, True])
def test_progress_bar_on_a_terminal_only_unless_disabled(
        hub_repos: HubRepos, hub_env: Path, disabled: bool) -> None:
    env = dict(os.environ)
    if disabled:
        env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    shown = _stderr_on_a_terminal(env)
    assert ("Fetching 1 files" in shown) is not disabled, shown
