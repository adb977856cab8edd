"""``kvrelay generate`` against a scripted worker (the real one is in test_cli_worker and
test_stack_up): streaming, JSON, stdin, finding the stack and the model, one-line errors."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import CLI_DB, announce, cli_env, one_line_error, run_cli
from helpers.fake_worker import ThreadWorker
from helpers.redis_db import fresh_db_url
from helpers.redis_server import free_port

pytestmark = pytest.mark.integration

MODEL = "fake-model"


@pytest.fixture
def fake_worker(redis_url: str) -> Iterator[ThreadWorker]:
    url = fresh_db_url(redis_url, CLI_DB)
    announce(url, MODEL)
    with ThreadWorker(url, MODEL, texts=["Hel", "lo", " there"]) as worker:
        yield worker


def test_streams_the_answer(tmp_path: Path, fake_worker: ThreadWorker) -> None:
    args = ["generate", "Say hello", "--redis-url", fake_worker.url, "--model", MODEL]
    result = run_cli([*args, "--max-tokens", "5", "--temperature", "0"], cli_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hello there\n"
    assert "3 tokens in" in result.stderr
    (request,) = fake_worker.requests
    assert request.messages is not None
    assert [(m.role, m.content) for m in request.messages] == [("user", "Say hello")]
    assert request.sampling.max_tokens == 5
    assert request.sampling.temperature == 0.0


def test_json_output(tmp_path: Path, fake_worker: ThreadWorker) -> None:
    env = cli_env(tmp_path, KVRELAY_REDIS_URL=fake_worker.url)
    result = run_cli(["generate", "Say hello", "--json", "--system", "Be brief."], env)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["text"] == "Hello there"
    assert answer["finish_reason"] == "stop"
    assert answer["model"] == MODEL  # the only model served was picked
    assert set(answer) >= {"job_id", "token_ids", "usage", "timings", "worker"}
    (request,) = fake_worker.requests
    assert request.messages is not None
    assert [m.role for m in request.messages] == ["system", "user"]


def test_prompt_from_stdin(tmp_path: Path, fake_worker: ThreadWorker) -> None:
    env = cli_env(tmp_path, KVRELAY_REDIS_URL=fake_worker.url)
    result = run_cli(["generate", "-", "-q"], env, stdin="a prompt\nover two lines\n")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert fake_worker.requests[0].messages[0].content == "a prompt\nover two lines\n"  # type: ignore[index]


def test_finds_the_running_stack(tmp_path: Path, fake_worker: ThreadWorker) -> None:
    env = cli_env(tmp_path)
    run = Path(env["KVRELAY_RUN_DIR"])
    run.mkdir(parents=True)
    record = {"redis_url": fake_worker.url, "model": MODEL, "pid": os.getpid(),
              "started_at": time.time()}  # fmt: skip
    (run / "stack.json").write_text(json.dumps(record))
    result = run_cli(["generate", "Hi"], env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hello there\n"


def test_unknown_model_is_one_line(tmp_path: Path, fake_worker: ThreadWorker) -> None:
    env = cli_env(tmp_path, KVRELAY_REDIS_URL=fake_worker.url)
    result = run_cli(["generate", "Hi", "--model", "nope"], env)
    assert result.returncode == 1
    line = one_line_error(result.stderr)
    assert line.startswith(
        "kvrelay: error: no live worker serves model 'nope' (served: fake-model)"
    )
    assert fake_worker.requests == []


def test_unreachable_redis_is_one_line(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = run_cli(["generate", "Hi", "--redis-url", url], cli_env(tmp_path))
    assert result.returncode == 1
    line = one_line_error(result.stderr)
    assert "kvrelay up --serve" in line
    assert "KVRELAY_REDIS_URL" in line


def test_empty_prompt_is_refused(tmp_path: Path) -> None:
    result = run_cli(["generate", "  "], cli_env(tmp_path))
    assert result.returncode == 1
    assert one_line_error(result.stderr) == "kvrelay: error: the prompt is empty"
