"""``kvrelay generate --json-schema FILE / --regex / --choice`` put ``response_format`` on
the wire (checked on the request a scripted worker receives); two at once is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import CLI_DB, announce, cli_env, run_cli
from helpers.fake_worker import ThreadWorker
from helpers.redis_db import fresh_db_url

from kvrelay.protocol import ChoiceFormat, JsonSchemaFormat, RegexFormat

pytestmark = pytest.mark.integration

MODEL = "fake-model"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture
def fake_worker(redis_url: str) -> Iterator[ThreadWorker]:
    url = fresh_db_url(redis_url, CLI_DB)
    announce(url, MODEL)
    with ThreadWorker(url, MODEL, texts=['{"a": 1}']) as worker:
        yield worker


def test_flags_reach_the_request(tmp_path: Path, fake_worker: ThreadWorker) -> None:
    schema_file = tmp_path / "answer.json"
    schema_file.write_text(json.dumps(SCHEMA))
    env = cli_env(tmp_path, KVRELAY_REDIS_URL=fake_worker.url)
    for flags in (["--json-schema", str(schema_file)], ["--regex", "[0-9]+"],
                  ["--choice", "yes", "--choice", "no"]):
        result = run_cli(["generate", "Answer", "-q", *flags], env)
        assert result.returncode == 0, result.stderr
    schema, regex, choice = (r.sampling.response_format for r in fake_worker.requests)
    assert isinstance(schema, JsonSchemaFormat)
    assert schema.json_schema.schema == SCHEMA
    assert schema.json_schema.name == "answer"
    assert regex == RegexFormat(pattern="[0-9]+")
    assert choice == ChoiceFormat(choices=["yes", "no"])


def test_two_formats_and_a_bad_file_are_refused(tmp_path: Path,
                                                 fake_worker: ThreadWorker) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    env = cli_env(tmp_path, KVRELAY_REDIS_URL=fake_worker.url)
    both = run_cli(["generate", "x", "--regex", "a", "--choice", "b"], env)
    assert both.returncode == 2
    assert "give one of --json-schema, --regex, --choice" in both.stderr
    broken = run_cli(["generate", "x", "--json-schema", str(bad)], env)
    assert broken.returncode == 2
    assert "--json-schema" in broken.stderr
    assert fake_worker.requests == []


def test_beam_flags_reach_the_request(tmp_path: Path, fake_worker: ThreadWorker) -> None:
    env = cli_env(tmp_path, KVRELAY_REDIS_URL=fake_worker.url)
    result = run_cli(["generate", "Answer", "-q", "--beam-width", "4", "--length-penalty",
                      "0.5", "--early-stopping", "never"], env)
    assert result.returncode == 0, result.stderr
    result = run_cli(["generate", "Answer", "-q", "--beam-width", "2", "--early-stopping",
                      "true"], env)
    assert result.returncode == 0, result.stderr
    first, second = (r.sampling for r in fake_worker.requests)
    assert (first.beam_width, first.length_penalty, first.early_stopping) == (4, 0.5, "never")
    assert (second.beam_width, second.early_stopping) == (2, True)
    too_wide = run_cli(["generate", "x", "--beam-width", "17"], env)
    assert too_wide.returncode == 2
    assert "--beam-width" in too_wide.stderr
