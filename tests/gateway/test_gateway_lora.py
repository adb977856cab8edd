"""LoRA adapters through the OpenAI-compatible gateway, with the real ``openai`` client:
``/v1/models`` lists each adapter with its parent, a request naming an adapter is served
by its base model's worker with the adapter (the same tokens as the SDK's ``lora=``), and
the admin routes load, unload and list adapters under the admin key only."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from helpers.gateway_process import GatewayProcess
from helpers.worker_fixtures import TINY
from helpers.worker_process import WorkerProcess
from openai import NotFoundError, OpenAI

from kvrelay import Client

pytestmark = pytest.mark.integration

PROMPT = [21, 22, 23, 24, 25, 26, 27]
ADMIN = {"Authorization": "Bearer sk-admin"}


@pytest.fixture
def served(start_worker: Callable[..., WorkerProcess], clean_redis_url: str, tmp_path: Path,
           lora_adapters: dict[str, Path]) -> Iterator[tuple[GatewayProcess, OpenAI]]:
    """A worker holding adapter "tone" (two slots), a gateway with an admin key."""
    start_worker("w1", concurrency=4, max_loras=2, lora_modules=f"tone={lora_adapters['tone']}")
    gateway = GatewayProcess(clean_redis_url, tmp_path, "gateway",
                             KVRELAY_GATEWAY_ADMIN_KEY="sk-admin").start()
    try:
        with OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                    timeout=60) as api:
            yield gateway, api
    finally:
        gateway.stop()


def _sdk_text(url: str, lora: str | None) -> str:
    with Client(url, model=TINY) as client:
        return client.generate(prompt_token_ids=PROMPT, max_tokens=10, temperature=0.0,
                               ignore_eos=True, lora=lora).text


def _completion(api: OpenAI, model: str) -> tuple[str, str]:
    answer = api.completions.create(model=model, prompt=PROMPT, max_tokens=10, temperature=0,
                                    extra_body={"ignore_eos": True})
    return answer.model, answer.choices[0].text


def test_models_list_adapters_and_a_request_naming_one_uses_it(
        served: tuple[GatewayProcess, OpenAI], clean_redis_url: str) -> None:
    _, api = served
    listed = {m.id: getattr(m, "parent", None) for m in api.models.list()}
    assert listed == {TINY: None, "tone": TINY}

    assert _completion(api, "tone") == ("tone", _sdk_text(clean_redis_url, "tone"))
    assert _completion(api, TINY) == (TINY, _sdk_text(clean_redis_url, None))
    assert _sdk_text(clean_redis_url, "tone") != _sdk_text(clean_redis_url, None)

    chunks = api.chat.completions.create(model="tone", stream=True, max_tokens=6,
                                         messages=[{"role": "user", "content": "hi"}])
    assert {chunk.model for chunk in chunks} == {"tone"}


def test_admin_routes_load_list_and_unload(served: tuple[GatewayProcess, OpenAI],
                                           clean_redis_url: str,
                                           lora_adapters: dict[str, Path]) -> None:
    gateway, api = served
    route = f"{gateway.url}/v1/admin/adapters"
    style = {"name": "style", "path": str(lora_adapters["style"]), "model": TINY}
    assert httpx.post(route, json=style, timeout=30).status_code == 401  # no key
    wrong = {"Authorization": "Bearer sk-tenant"}
    assert httpx.get(route, headers=wrong, timeout=30).status_code == 401

    loaded = httpx.post(route, json=style, headers=ADMIN, timeout=60)
    assert loaded.status_code == 200, loaded.text
    assert (loaded.json()["id"], loaded.json()["parent"], len(loaded.json()["workers"])) == (
        "style", TINY, 1)
    listing = httpx.get(route, headers=ADMIN, timeout=30).json()["data"]
    assert sorted((a["id"], a["parent"]) for a in listing) == [("style", TINY), ("tone", TINY)]
    assert _completion(api, "style") == ("style", _sdk_text(clean_redis_url, "style"))

    bad = httpx.post(route, json={**style, "name": "broken", "path": "/nowhere"},
                     headers=ADMIN, timeout=60)
    assert bad.status_code == 400
    assert "no adapter folder" in bad.json()["error"]["message"]
    missing = httpx.post(route, json={"name": "x", "model": TINY}, headers=ADMIN, timeout=30)
    assert (missing.status_code, missing.json()["error"]["param"]) == (400, "path")

    unloaded = httpx.delete(f"{route}/style", headers=ADMIN, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    assert "style" not in {m.id for m in api.models.list()}
    with pytest.raises(NotFoundError):
        api.completions.create(model="style", prompt=PROMPT, max_tokens=2)
    again = httpx.delete(f"{route}/style", headers=ADMIN, timeout=30)
    assert again.status_code == 400
    assert "holds adapter 'style'" in again.text


def test_admin_routes_are_off_without_an_admin_key(clean_redis_url: str,
                                                   tmp_path: Path) -> None:
    gateway = GatewayProcess(clean_redis_url, tmp_path, "open-gateway").start()
    try:
        for method in ("GET", "POST"):
            answer = httpx.request(method, f"{gateway.url}/v1/admin/adapters", headers=ADMIN,
                                   json={"name": "a", "path": "/x", "model": TINY}, timeout=30)
            assert answer.status_code == 403, answer.text
            assert "KVRELAY_GATEWAY_ADMIN_KEY" in answer.json()["error"]["message"]
    finally:
        gateway.stop()
