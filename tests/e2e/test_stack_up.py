"""``kvrelay up``: the whole stack on this machine, and nothing left behind however it ends
(an answer, Ctrl-C, a dying worker, or ``kvrelay up`` itself killed)."""

from __future__ import annotations

import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from cli_support import (
    STACK_DB,
    background_cli,
    cli_env,
    one_line_error,
    run_cli,
    wait_no_leftovers,
)
from helpers.gateway_process import free_port
from helpers.redis_db import fresh_db_url

from kvrelay.cli import stack_file

pytestmark = pytest.mark.integration

TINY = "llama-mqa"


def tiny_args(tiny_model: Callable[[str], Path]) -> list[str]:
    return ["--model", str(tiny_model(TINY)), "--device", "cpu", "--concurrency", "2"]


def assert_clean(env: dict[str, str], tmp_path: Path) -> None:
    assert wait_no_leftovers(env["KVRELAY_TEST_MARKER"]) == []
    assert list(tmp_path.glob("kvrelay-up-*")) == [], "the stack's temporary folder remains"


def test_bad_model_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    result = run_cli(["up", "--model", str(tmp_path / "missing")], env, timeout=60)
    assert result.returncode == 1
    assert "unknown model" in one_line_error(result.stderr)
    assert "Redis:" not in result.stderr
    assert_clean(env, tmp_path)


def test_answers_with_the_configured_redis(
    tmp_path: Path, redis_url: str, tiny_model: Callable[[str], Path]
) -> None:
    url = fresh_db_url(redis_url, STACK_DB)
    env = cli_env(tmp_path, KVRELAY_REDIS_URL=url)
    args = ["up", "Hello there", *tiny_args(tiny_model), "--max-tokens", "6"]
    result = run_cli(args, env, timeout=240)
    assert result.returncode == 0, result.stderr
    assert f"Redis: {url}\n" in result.stderr  # used, not a private one
    assert "Worker ready in" in result.stderr
    assert "> Hello there" in result.stderr
    assert "6 tokens in" in result.stderr or "finish: stop" in result.stderr
    assert result.stdout.endswith("\n")
    assert "Stopped." in result.stderr
    assert_clean(env, tmp_path)


def test_serve_generate_then_ctrl_c(tmp_path: Path, tiny_model: Callable[[str], Path]) -> None:
    env = cli_env(tmp_path)
    record = Path(env["KVRELAY_RUN_DIR"]) / "stack.json"
    with background_cli(["up", "--serve", *tiny_args(tiny_model)], env, tmp_path / "up") as up:
        up.wait_for(lambda: "KVRELAY_REDIS_URL=redis://127.0.0.1:" in up.stdout, 240, "the URL")
        assert "(private)" in up.stderr
        assert record.is_file()
        # Another shell: no URL given, the running stack is found through its record.
        answer = run_cli(["generate", "Hi", "--max-tokens", "4", "--json"], env)
        assert answer.returncode == 0, answer.stderr
        assert '"model":"llama-mqa"' in answer.stdout
        up.send(signal.SIGINT)
        assert up.wait(60) == 0, up.stderr
        assert "Stopped." in up.stderr
    assert not record.exists()
    assert_clean(env, tmp_path)


def test_serve_http_answers_openai_requests_then_ctrl_c(
        tmp_path: Path, tiny_model: Callable[[str], Path]) -> None:
    env = cli_env(tmp_path)
    port = free_port()
    args = ["up", "--serve", "--http", str(port), *tiny_args(tiny_model)]
    with background_cli(args, env, tmp_path / "up") as up:
        up.wait_for(lambda: "KVRELAY_REDIS_URL=redis://127.0.0.1:" in up.stdout, 240, "the URL")
        base = f"http://127.0.0.1:{port}/v1"
        up.wait_for(lambda: _answers(f"{base}/models"), 60, "the gateway")
        models = httpx.get(f"{base}/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [TINY]
        answer = httpx.post(f"{base}/completions", timeout=60,
                            json={"model": TINY, "prompt": [5, 6], "max_tokens": 3,
                                  "ignore_eos": True})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 3
        up.send(signal.SIGINT)
        assert up.wait(60) == 0, up.stderr
    assert not _answers(f"http://127.0.0.1:{port}/v1/models")  # the gateway went too
    assert_clean(env, tmp_path)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_killed_up_takes_its_children_along(
    tmp_path: Path, tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = cli_env(tmp_path)
    with background_cli(["up", "--serve", *tiny_args(tiny_model)], env, tmp_path / "up") as up:
        up.wait_for(lambda: "KVRELAY_REDIS_URL=" in up.stdout, 240, "the stack")
        up.send(signal.SIGKILL)
        up.wait(10)
        assert wait_no_leftovers(env["KVRELAY_TEST_MARKER"]) == []
    # A killed process cannot remove its record: readers ignore a record whose pid is gone.
    monkeypatch.setenv("KVRELAY_RUN_DIR", env["KVRELAY_RUN_DIR"])
    assert (Path(env["KVRELAY_RUN_DIR"]) / "stack.json").is_file()
    assert stack_file.read_live_record() is None


def test_a_dying_worker_is_one_line(tmp_path: Path, tiny_model: Callable[[str], Path]) -> None:
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model(TINY), broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    env = cli_env(tmp_path)
    args = ["up", "Hi", "--model", str(broken), "--device", "cpu", "--concurrency", "2"]
    result = run_cli(args, env, timeout=240)
    assert result.returncode == 1
    line = one_line_error(result.stderr)
    assert "the worker exited with status" in line
    assert "before it was ready" in line
    log = Path(line.rsplit("full log: ", 1)[1])
    assert log.is_file()  # kept for the user to read
    assert wait_no_leftovers(env["KVRELAY_TEST_MARKER"]) == []


@pytest.mark.slow
def test_default_model_demo(tmp_path: Path) -> None:
    """What `make demo` runs: SmolLM2 (cached after its first conversion) on this machine."""
    from kvrelay_worker.loading import DEFAULT_MODEL, REGISTRY

    if REGISTRY[DEFAULT_MODEL].locate() is None:
        pytest.skip(f"needs `{REGISTRY[DEFAULT_MODEL].install_hint}`")
    env = cli_env(tmp_path)
    args = ["up", "What is the capital of France? Answer in one sentence.", "--max-tokens", "24"]
    result = run_cli(args, env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Worker ready in" in result.stderr
    assert f"{DEFAULT_MODEL} on " in result.stderr
    assert "Paris" in result.stdout
    assert_clean(env, tmp_path)
