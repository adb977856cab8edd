"""``kvrelay chat``: the conversation is kept and sent whole each turn; /reset forgets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import CLI_DB, announce, cli_env, one_line_error, run_cli
from helpers.fake_worker import ThreadWorker
from helpers.redis_db import fresh_db_url

from kvrelay.cli.chat import ChatSession

MODEL = "fake-chat-model"


def test_session_keeps_turns_in_order() -> None:
    session = ChatSession(system="Be kind.")
    assert session.messages_for("hi") == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "hi"},
    ]
    session.record("hi", "hello")
    assert [m["role"] for m in session.messages_for("again")] == [
        "system", "user", "assistant", "user",
    ]  # fmt: skip
    session.reset()
    assert len(session.messages_for("x")) == 2


@pytest.fixture
def fake_worker(redis_url: str) -> Iterator[ThreadWorker]:
    url = fresh_db_url(redis_url, CLI_DB)
    announce(url, MODEL)
    with ThreadWorker(url, MODEL, texts=["Hel", "lo"]) as worker:
        yield worker


@pytest.mark.integration
def test_chat_sends_the_history(tmp_path: Path, fake_worker: ThreadWorker) -> None:
    env = cli_env(tmp_path, KVRELAY_REDIS_URL=fake_worker.url)
    lines = "My name is Ada.\nWhat is my name?\n/reset\nWho am I?\n/exit\nnever sent\n"
    result = run_cli(["chat", "--max-tokens", "8"], env, stdin=lines)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hello\nHello\nHello\n"
    assert "(conversation forgotten)" in result.stderr
    turns = [[(m.role, m.content) for m in r.messages or []] for r in fake_worker.requests]
    assert turns == [
        [("user", "My name is Ada.")],
        [("user", "My name is Ada."), ("assistant", "Hello"), ("user", "What is my name?")],
        [("user", "Who am I?")],
    ]


@pytest.mark.integration
def test_chat_with_an_unknown_model_is_one_line(tmp_path: Path, fake_worker: ThreadWorker) -> None:
    env = cli_env(tmp_path, KVRELAY_REDIS_URL=fake_worker.url)
    result = run_cli(["chat", "--model", "nope"], env, stdin="hello\n")
    assert result.returncode == 1
    assert "no live worker serves model 'nope'" in one_line_error(result.stderr)
