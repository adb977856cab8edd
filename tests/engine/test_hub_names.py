"""Reading ``org/name[@revision][:QUANT]`` and the served name, with no network: the worker's
queue name is derived from these before anything is downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kvrelay.cli.main import cli
from kvrelay_worker.loading.gguf_pick import available_tags, gguf_tag, pick_gguf, single_gguf
from kvrelay_worker.loading.hub_name import (
    HubName,
    default_served_name,
    hub_cache_repo_id,
    parse_hub_name,
)
from kvrelay_worker.models.errors import UnknownModelError
from kvrelay_worker.settings import WorkerSettings


@pytest.mark.parametrize(("text", "expected"), [
    ("Qwen/Qwen2.5-0.5B-Instruct", HubName("Qwen/Qwen2.5-0.5B-Instruct")),
    ("org/name@v2", HubName("org/name", "v2")),
    ("org/name@refs/pr/1", HubName("org/name", "refs/pr/1")),
    ("org/name@" + "a" * 40, HubName("org/name", "a" * 40)),
    ("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
     HubName("bartowski/Llama-3.2-1B-Instruct-GGUF", None, "Q4_K_M")),
    ("org/name@main:q8_0", HubName("org/name", "main", "q8_0")),
    ("hf.co/org/name:Q4_K_M", HubName("org/name", None, "Q4_K_M")),
    ("https://huggingface.co/org/name", HubName("org/name")),
])
def test_repository_names(text: str, expected: HubName) -> None:
    assert parse_hub_name(text) == expected


@pytest.mark.parametrize("text", [
    "smollm2-135m-instruct",  # no org: a registry name or nothing
    "/models/qwen", "./models/qwen", "~/models/qwen", "models/qwen/extra",
    "org/name.gguf/x", "org/-name", "org--x/name", "org/na..me", "org/name@", "org/name:",
    "org/name@v1:Q4 K", "simulated:llama-8b", "org/name:Q4_K_M@main", "C:/models/x",
])
def test_what_is_not_a_repository(text: str) -> None:
    assert parse_hub_name(text) is None


def test_served_name_leaves_the_revision_out_and_keeps_the_pick() -> None:
    assert HubName("org/name", "v2").served_name == "org/name"
    assert HubName("org/name", "v2", "Q4_K_M").served_name == "org/name:Q4_K_M"
    assert str(HubName("org/name", "v2", "Q4_K_M")) == "org/name@v2:Q4_K_M"
    assert WorkerSettings(model="org/name@v2").served_model == "org/name"
    assert WorkerSettings(model="org/name@v2", model_name="mine").served_model == "mine"


def test_a_folder_of_the_hugging_face_cache_is_served_as_its_repository(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub" / "models--org--my-model" / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    assert hub_cache_repo_id(snapshot) == "org/my-model"
    assert default_served_name(str(snapshot)) == "org/my-model"
    assert WorkerSettings(model=str(snapshot)).served_model == "org/my-model"
    # A GGUF inside it keeps its own file name, not the name of the blob it links to.
    blob = tmp_path / "hub" / "models--org--my-model" / "blobs" / ("e" * 64)
    blob.parent.mkdir()
    blob.write_bytes(b"GGUF")
    (snapshot / "model-Q8_0.gguf").symlink_to(blob)
    assert default_served_name(str(snapshot / "model-Q8_0.gguf")) == "model-Q8_0"
    # Any other folder keeps its own name.
    plain = tmp_path / "snapshots" / "plain"
    plain.mkdir(parents=True)
    assert hub_cache_repo_id(plain) is None
    assert default_served_name(str(plain)) == "plain"


def test_an_existing_local_folder_wins_over_the_repository(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert default_served_name("org/name") == "org/name"
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert default_served_name("org/name") == "name"  # the folder, served by its name


def test_worker_dry_run_serves_the_repository_on_its_queue(tmp_path: Path) -> None:
    """No download for a dry run: the name alone gives the queue."""
    result = CliRunner().invoke(cli, ["worker", "--dry-run", "--model", "org/name@v2"],
                                env={"KVRELAY_CACHE_DIR": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert "KVRELAY_MODEL=org/name@v2" in result.output
    assert "--queues kvrelay:queue:org/name " in result.output


# --- picking a GGUF file by its quantization tag -------------------------------------

FILES = ["README.md", "Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Llama-3.2-1B-Instruct-Q4_K_S.gguf",
         "Llama-3.2-1B-Instruct-Q8_0.gguf", "Llama-3.2-1B-Instruct-IQ3_XS.gguf",
         "Llama-3.2-1B-Instruct-f16.gguf", "Llama-3.2-1B-Instruct-UD-Q4_K_XL.gguf"]


@pytest.mark.parametrize(("tag", "expected"), [
    ("Q4_K_M", "Llama-3.2-1B-Instruct-Q4_K_M.gguf"),
    ("q4_k_m", "Llama-3.2-1B-Instruct-Q4_K_M.gguf"),  # case aside
    ("Q8_0", "Llama-3.2-1B-Instruct-Q8_0.gguf"),
    ("F16", "Llama-3.2-1B-Instruct-f16.gguf"),
    ("UD-Q4_K_XL", "Llama-3.2-1B-Instruct-UD-Q4_K_XL.gguf"),
])
def test_pick_by_tag(tag: str, expected: str) -> None:
    assert pick_gguf(FILES, tag, "org/x") == expected


def test_a_shorter_tag_is_no_match_and_the_error_lists_the_tags() -> None:
    with pytest.raises(UnknownModelError) as info:
        pick_gguf(FILES, "Q4_K", "org/x")  # Q4_K_M and Q4_K_S carry longer tags
    message = str(info.value)
    assert "org/x has no .gguf file tagged Q4_K" in message
    for tag in ("Q4_K_M", "Q4_K_S", "Q8_0", "IQ3_XS", "F16", "UD-Q4_K_XL"):
        assert tag in message


def test_several_matches_are_refused_by_name() -> None:
    split = ["m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf", "m-Q8_0.gguf"]
    with pytest.raises(UnknownModelError, match=r"2 \.gguf files of org/x carry the tag "
                                                r"Q4_K_M: m-Q4_K_M-00001-of-00002\.gguf"):
        pick_gguf(split, "Q4_K_M", "org/x")
    with pytest.raises(UnknownModelError, match=r"holds no \.gguf file"):
        pick_gguf(["config.json", "model.safetensors"], "Q4_K_M", "org/x")


def test_no_tag_takes_the_only_file_or_lists_the_choices() -> None:
    assert single_gguf(["README.md", "m-Q8_0.gguf"], "org/x") == "m-Q8_0.gguf"
    with pytest.raises(UnknownModelError, match=r"org/x:Q4_K_M, org/x:Q4_K_S"):
        single_gguf(FILES, "org/x")


def test_tags_read_from_file_names() -> None:
    assert gguf_tag("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert gguf_tag("qwen2.5-0.5b-instruct-q4_k_m.gguf") == "Q4_K_M"
    assert gguf_tag("Q6_K/model-00001-of-00002.gguf") == "Q6_K"  # a folder per quantization
    assert gguf_tag("qwen3-8b.gguf") is None
    assert available_tags(["a-Q8_0.gguf", "plain.gguf", "x.txt"]) == ["Q8_0", "plain.gguf"]
