"""An adapter named ``org/name[@revision]`` is fetched from the Hub like a model: a local
server speaking the hub's routes, the real ``huggingface_hub`` client, a real engine, and
the same tokens as the adapter loaded from its folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.engine_run import one_torch_thread
from helpers.hub_fixtures import HubRepos
from helpers.worker_fixtures import TINY

from kvrelay_worker.engine import LLM
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.served_adapters import adapter_folder

ADAPTER_REPO = "tests-org/tiny-tone-lora"
PROMPT = [5, 17, 99, 230, 41, 8]


def _greedy(engine: object, lora: str) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    engine.add_request("r-" + lora, list(PROMPT), params, lora=lora)  # type: ignore[attr-defined]
    tokens: list[int] = []
    while engine.has_unfinished_requests():  # type: ignore[attr-defined]
        for out in engine.step():  # type: ignore[attr-defined]
            if out.output is not None:
                tokens = out.output.token_ids
    return tokens


def test_adapter_by_repository_name_matches_its_folder(
        hub_repos: HubRepos, hub_env: Path, lora_adapters: dict[str, Path],
        tiny_model: Callable[[str], Path]) -> None:
    folder = lora_adapters["tone"]
    hub_repos.hub.publish_folder(ADAPTER_REPO, folder)
    before = len(hub_repos.hub.requests)  # the session's hub: earlier tests' requests too
    fetched = adapter_folder(ADAPTER_REPO)
    assert fetched.is_relative_to(hub_env)
    assert sorted(p.name for p in fetched.iterdir()) == ["adapter_config.json",
                                                         "adapter_model.safetensors"]
    resolved = {r.path.rsplit("/", 1)[-1] for r in hub_repos.hub.file_requests(before)
                if "/resolve/" in r.path}
    assert resolved == {"adapter_config.json", "adapter_model.safetensors"}
    with one_torch_thread():
        engine = LLM(str(tiny_model(TINY)), device="cpu", dtype="float32", num_kv_blocks=64,
                     max_model_len=256, max_loras=2).engine
        engine.add_lora("by-name", str(fetched))
        engine.add_lora("by-folder", str(folder))
        assert _greedy(engine, "by-name") == _greedy(engine, "by-folder")


def test_a_missing_adapter_repository_says_so(hub_env: Path) -> None:
    with pytest.raises(ValueError, match="tests-org/no-such-lora"):
        adapter_folder("tests-org/no-such-lora")
    with pytest.raises(ValueError, match="no adapter folder"):
        adapter_folder("./not/here")
