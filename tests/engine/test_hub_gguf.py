"""``org/name:Q4_K_M`` picks one ``.gguf`` file of a repository (llama.cpp's and Ollama's
convention), fetches that file alone, and loads it like any GGUF; a tag that names no file
(or several) is refused with the tags there are."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.hub_fixtures import GGUF_REPO, REPO, HubRepos

from kvrelay.cli.main import cli
from kvrelay_worker.loading import load_model_source, resolve_model
from kvrelay_worker.models.errors import UnknownModelError


def _fetched_names(hub_repos: HubRepos, since: int) -> set[str]:
    return {r.path.rsplit("/", 1)[-1] for r in hub_repos.hub.file_requests(since)
            if "/resolve/" in r.path}


@pytest.mark.parametrize(("tag", "file"), [("Q4_K_M", "tiny-llama-Q4_K_M.gguf"),
                                           ("q8_0", "tiny-llama-Q8_0.gguf")])
def test_tag_picks_one_file_and_fetches_it_alone(
        hub_repos: HubRepos, hub_env: Path, tag: str, file: str) -> None:
    since = len(hub_repos.hub.requests)
    source = resolve_model(f"{GGUF_REPO}:{tag}")
    assert (source.kind, source.name) == ("gguf", f"{GGUF_REPO}:{tag}")
    assert source.path.name == file
    assert source.path.read_bytes() == hub_repos.ggufs[file].read_bytes()
    assert _fetched_names(hub_repos, since) == {file}
    assert source.cache_dir is not None
    assert source.cache_dir.name.startswith(Path(file).stem + "-")


def test_picked_gguf_loads_like_the_same_file_on_disk(hub_repos: HubRepos, hub_env: Path) -> None:
    loaded = load_model_source(f"{GGUF_REPO}:Q8_0")
    assert loaded.name == f"{GGUF_REPO}:Q8_0"
    reference = load_model_source(str(hub_repos.ggufs["tiny-llama-Q8_0.gguf"]))
    assert loaded.config == reference.config
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("the world")) == "the world"


def test_without_a_tag_the_error_lists_the_choices(hub_repos: HubRepos, hub_env: Path) -> None:
    since = len(hub_repos.hub.requests)
    with pytest.raises(UnknownModelError) as info:
        resolve_model(GGUF_REPO)
    assert f"{GGUF_REPO}:Q4_K_M, {GGUF_REPO}:Q8_0" in str(info.value)
    with pytest.raises(UnknownModelError) as info:
        resolve_model(f"{GGUF_REPO}:Q5_K_M")
    assert f"{GGUF_REPO} has no .gguf file tagged Q5_K_M; its tags: Q4_K_M, Q8_0" in str(info.value)
    with pytest.raises(UnknownModelError, match=rf"{REPO} holds no \.gguf file"):
        resolve_model(f"{REPO}:Q4_K_M")
    assert hub_repos.hub.file_requests(since) == []  # refused before any download


def test_models_prepare_downloads_converts_and_checks(hub_repos: HubRepos, hub_env: Path) -> None:
    result = CliRunner().invoke(cli, ["models", "prepare", f"{GGUF_REPO}:Q8_0"])
    assert result.exit_code == 0, result.output
    assert f"{GGUF_REPO}:Q8_0: ready in" in result.output
    result = CliRunner().invoke(cli, ["models", "prepare", "kvrelay-test/no-such-model"])
    assert result.exit_code == 1
    assert "no model kvrelay-test/no-such-model on" in result.output
    assert "Traceback" not in result.output
