"""``kvrelay adapters load / list / unload`` against a real worker, and ``generate --lora``:
each command is a real ``kvrelay`` process; mistakes are one line on stderr."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import cli_env, one_line_error, run_cli
from helpers.worker_fixtures import TINY
from helpers.worker_process import WorkerProcess

from kvrelay import Client

pytestmark = pytest.mark.integration


def test_load_list_use_and_unload_an_adapter(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str, tmp_path: Path,
        lora_adapters: dict[str, Path]) -> None:
    start_worker("w1", max_loras=1)
    env = cli_env(tmp_path, KVRELAY_REDIS_URL=clean_redis_url)
    tone = str(lora_adapters["tone"])

    listed = run_cli(["adapters", "list"], env)
    assert (listed.returncode, listed.stdout) == (0, "no adapters (load one with "
                                                     "`kvrelay adapters load NAME PATH`)\n")
    loaded = run_cli(["adapters", "load", "tone", tone], env)  # the only model served
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith(f"adapter tone of {TINY} loaded on 1 worker(s): ")
    listed = run_cli(["adapters", "list", "--json"], env)
    (entry,) = json.loads(listed.stdout)
    assert (entry["name"], entry["base"], entry["path"], len(entry["workers"])) == (
        "tone", TINY, tone, 1)

    asked = ["generate", "hi", "--lora", "tone", "--json", "--temperature", "0",
             "--max-tokens", "6"]
    answer = run_cli(asked, env)
    assert answer.returncode == 0, answer.stderr
    with Client(clean_redis_url, model=TINY) as client:
        expected = client.generate(messages=[{"role": "user", "content": "hi"}], lora="tone",
                                   temperature=0.0, max_tokens=6)
        plain = client.generate(messages=[{"role": "user", "content": "hi"}],
                                temperature=0.0, max_tokens=6)
    assert json.loads(answer.stdout)["token_ids"] == expected.token_ids != plain.token_ids

    unloaded = run_cli(["adapters", "unload", "tone"], env)
    assert unloaded.returncode == 0, unloaded.stderr
    assert unloaded.stdout.startswith("adapter tone unloaded from 1 worker(s)")
    assert json.loads(run_cli(["adapters", "list", "--json"], env).stdout) == []


# Each a mistake the worker, the SDK or the CLI catches (one worker serves them all).
MISTAKES = [
    (["adapters", "load", "broken", "/nowhere"], "no adapter folder at /nowhere"),
    (["adapters", "load", "a b", "/x"], "an adapter name is 1 to 128"),
    (["adapters", "load", "tone", "/x", "--model", "nope"], "no live worker serves model 'nope'"),
    (["adapters", "unload", "tone"], "no live worker holds adapter 'tone'"),
    (["generate", "hi", "--lora", "tone"], "no live worker of model 'llama-mqa' holds adapter"),
]


def test_mistakes_are_one_line(start_worker: Callable[..., WorkerProcess],
                               clean_redis_url: str, tmp_path: Path) -> None:
    start_worker("w1", max_loras=1)
    env = cli_env(tmp_path, KVRELAY_REDIS_URL=clean_redis_url)
    for args, message in MISTAKES:
        result = run_cli(args, env)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert message in one_line_error(result.stderr), args
