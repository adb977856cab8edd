"""``kvrelay generate --no-speculative`` puts ``speculative: false`` on the wire (checked on
the request a scripted worker receives); without the flag the wire default (True) holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import CLI_DB, announce, cli_env, run_cli
from helpers.fake_worker import ThreadWorker
from helpers.redis_db import fresh_db_url

pytestmark = pytest.mark.integration

MODEL = "fake-model"


@pytest.fixture
def fake_worker(redis_url: str) -> Iterator[ThreadWorker]:
    url = fresh_db_url(redis_url, CLI_DB)
    announce(url, MODEL)
    with ThreadWorker(url, MODEL, texts=["ok"]) as worker:
        yield worker


def test_the_flag_reaches_the_request(tmp_path: Path, fake_worker: ThreadWorker) -> None:
    env = cli_env(tmp_path, KVRELAY_REDIS_URL=fake_worker.url)
    for flags in (["--no-speculative"], []):
        result = run_cli(["generate", "Answer", "-q", *flags], env)
        assert result.returncode == 0, result.stderr
    opted_out, default = (r.sampling.speculative for r in fake_worker.requests)
    assert (opted_out, default) == (False, True)
