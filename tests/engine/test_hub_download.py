"""``org/name[@revision]`` downloads through huggingface_hub from a hub (a local server
speaking the hub's routes) into the Hugging Face cache: only what the loader reads, once,
pinned to a revision, offline afterwards, and every failure said as its fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.hub_fixtures import (
    GATED_REPO,
    MISSING_REPO,
    NOT_FOR_THE_LOADER,
    PICKLED_REPO,
    REPO,
    REVISION,
    TOKEN,
    HubRepos,
)

from kvrelay_worker.loading import HubAccessError, fetch_repo, load_model_source, resolve_model
from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.settings import WorkerSettings


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return dict(load_model_source(str(folder)).weights())


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_download_fetches_what_the_loader_reads_and_serves_as_org_name(
        hub_repos: HubRepos, hub_env: Path, capfd: pytest.CaptureFixture[str]) -> None:
    since = len(hub_repos.hub.requests)
    source = resolve_model(REPO)
    assert (source.kind, source.name) == ("hf_folder", REPO)
    assert source.path.parent == hub_env / "models--kvrelay-test--tiny-llama" / "snapshots"
    # Config, tokenizer files and safetensors: the checkpoint as written, nothing beside it.
    fetched = {p.name for p in source.path.iterdir()}
    assert fetched == {p.name for p in hub_repos.main.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= fetched
    asked = {r.path.rsplit("/", 1)[-1] for r in hub_repos.hub.file_requests(since)}
    assert not asked & {Path(name).name for name in NOT_FOR_THE_LOADER}, asked
    # Not a terminal: no progress bar on stderr.
    assert "Fetching" not in capfd.readouterr().err
    loaded = load_model_source(REPO)
    assert loaded.name == REPO
    assert _same_weights(dict(loaded.weights()), _weights(hub_repos.main))


def test_second_resolve_asks_for_no_file(hub_repos: HubRepos, hub_env: Path) -> None:
    first = resolve_model(REPO).path
    since = len(hub_repos.hub.requests)
    assert resolve_model(REPO).path == first
    assert hub_repos.hub.file_requests(since) == []


def test_revision_pins_the_other_weights(hub_repos: HubRepos, hub_env: Path) -> None:
    main = resolve_model(REPO)
    pinned = resolve_model(f"{REPO}@{REVISION}")
    assert pinned.name == REPO  # served as org/name, revision left out
    assert pinned.path != main.path
    v2 = _weights(pinned.path)
    assert _same_weights(v2, _weights(hub_repos.v2))
    assert not _same_weights(v2, _weights(main.path))
    assert (hub_env / "models--kvrelay-test--tiny-llama" / "refs" / REVISION).is_file()


def test_offline_uses_the_cache_and_says_what_is_missing(
        hub_repos: HubRepos, hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    since = len(hub_repos.hub.requests)
    with pytest.raises(HubAccessError) as info:
        resolve_model(REPO)
    message = str(info.value)
    assert "not in the Hugging Face cache" in message
    assert "HF_HUB_OFFLINE" in message
    assert str(hub_env) in message
    assert hub_repos.hub.requests[since:] == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    downloaded = resolve_model(REPO).path
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    since = len(hub_repos.hub.requests)
    assert resolve_model(REPO).path == downloaded
    assert load_model_source(REPO).config.num_key_value_heads == 1
    with pytest.raises(HubAccessError, match="HF_HUB_OFFLINE"):
        resolve_model(f"{REPO}@{REVISION}")  # that revision was never fetched
    assert hub_repos.hub.requests[since:] == []  # offline: not one request


def test_gated_repository_needs_a_token(
        hub_repos: HubRepos, hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(HubAccessError) as info:
        resolve_model(GATED_REPO)
    message = str(info.value)
    assert f"{GATED_REPO} is gated" in message
    assert "HF_TOKEN=" in message
    assert "huggingface-cli login" in message
    monkeypatch.setenv("HF_TOKEN", "hf_someone_else")
    with pytest.raises(HubAccessError, match="is gated"):
        resolve_model(GATED_REPO)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    since = len(hub_repos.hub.requests)
    source = resolve_model(GATED_REPO)
    assert source.name == GATED_REPO
    resolves = [r for r in hub_repos.hub.file_requests(since) if "/resolve/" in r.path]
    assert resolves
    assert all(r.authorized for r in resolves)


def test_missing_repository_and_unknown_revision(hub_repos: HubRepos, hub_env: Path) -> None:
    with pytest.raises(HubAccessError) as info:
        resolve_model(MISSING_REPO)
    message = str(info.value)
    assert f"no model {MISSING_REPO} on {hub_repos.hub.url}" in message
    assert "exact name" in message
    assert "HF_TOKEN=" in message
    with pytest.raises(HubAccessError, match=rf"{REPO} has no revision 'no-such-branch'"):
        resolve_model(f"{REPO}@no-such-branch")


def test_unreachable_hub_is_named(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nobody listens
    with pytest.raises(HubAccessError, match=r"cannot reach http://127\.0\.0\.1:9 .*HF_ENDPOINT"):
        resolve_model(REPO)


def test_pickled_weights_are_refused_before_any_download(
        hub_repos: HubRepos, hub_env: Path) -> None:
    since = len(hub_repos.hub.requests)
    with pytest.raises(UnsupportedModelError, match="only pickled PyTorch weights"):
        resolve_model(PICKLED_REPO)
    assert hub_repos.hub.file_requests(since) == []


def test_a_local_folder_of_that_name_wins(
        hub_repos: HubRepos, hub_env: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(hub_repos.v2, tmp_path / REPO)
    since = len(hub_repos.hub.requests)
    source = resolve_model(REPO)
    assert source.path == (tmp_path / REPO).resolve()
    assert hub_repos.hub.requests[since:] == []


def test_snapshot_folder_serves_as_its_repository(hub_repos: HubRepos, hub_env: Path) -> None:
    snapshot = resolve_model(REPO).path
    assert resolve_model(str(snapshot)).name == REPO
    assert WorkerSettings(model=str(snapshot)).served_model == REPO


def test_any_repository_resolves_to_a_folder(hub_repos: HubRepos, hub_env: Path) -> None:
    """The door LoRA adapters (or anything else named org/name) use."""
    folder = fetch_repo(f"{REPO}@{REVISION}", ["config.json"], progress=False)
    assert [p.name for p in folder.iterdir()] == ["config.json"]
    assert (folder / "config.json").read_bytes() == (hub_repos.v2 / "config.json").read_bytes()


def test_cli_fetches_before_the_worker_starts(
        hub_repos: HubRepos, hub_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``kvrelay worker``/``up`` download first (a line says what, from where, into where);
    the worker then finds the repository in the cache."""
    from kvrelay.cli.errors import CliError
    from kvrelay.cli.worker_launch import check_model, fetch_if_repository

    check_model(f"{REPO}@{REVISION}")  # a name, not a path: accepted without the network
    folder = fetch_if_repository(f"{REPO}@{REVISION}")
    assert Path(folder) == resolve_model(f"{REPO}@{REVISION}").path
    assert f"Fetching {REPO}@{REVISION} from {hub_repos.hub.url} into {hub_env}" in (
        capsys.readouterr().err)
    assert fetch_if_repository("smollm2-135m-instruct") == "smollm2-135m-instruct"
    with pytest.raises(CliError, match=f"no model {MISSING_REPO} on"):
        fetch_if_repository(MISSING_REPO)
