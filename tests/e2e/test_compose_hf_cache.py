"""Compose workers keep models fetched by name (``KVRELAY_MODEL=org/name``) across restarts:
their Hugging Face cache lies on a named volume, and the hub settings pass through."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKERS = ("worker", "worker-cpu", "worker-ha")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((REPO / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("name", WORKERS)
def test_hugging_face_cache_is_on_a_named_volume(compose: dict[str, Any], name: str) -> None:
    worker = compose["services"][name]
    home = PurePosixPath(worker["environment"]["HF_HOME"])
    mounts = [volume.split(":")[:2] for volume in worker["volumes"]]
    on_volume = [(source, target) for source, target in mounts
                 if home == PurePosixPath(target) or PurePosixPath(target) in home.parents]
    assert on_volume, f"{name}: HF_HOME {home} is on no volume: {worker['volumes']}"
    assert all(source in compose["volumes"] for source, _ in on_volume)


@pytest.mark.parametrize("name", WORKERS)
def test_hub_settings_pass_through(compose: dict[str, Any], name: str) -> None:
    env = compose["services"][name]["environment"]
    assert env["HF_TOKEN"] == "${HF_TOKEN:-}"  # empty: anonymous, as huggingface_hub reads it
    assert env["HF_HUB_OFFLINE"] == "${HF_HUB_OFFLINE:-0}"
    assert "HF_ENDPOINT" not in env  # an empty HF_ENDPOINT would break the hub's URLs
