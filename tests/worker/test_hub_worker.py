"""A real worker process started with ``KVRELAY_MODEL=org/name@revision`` (what compose and
``kvrelay worker --model`` give it) downloads the repository from the hub into the Hugging
Face cache itself, serves it on ``org/name``'s queue, and answers as the offline ``LLM``
given the same name does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.engine_run import one_torch_thread
from helpers.hub_fixtures import REPO, REVISION, HubRepos
from helpers.worker_fixtures import TINY_KV_BYTES
from helpers.worker_process import WorkerProcess

from kvrelay import Client

pytestmark = pytest.mark.integration

PROMPT = [5, 17, 230, 4021, 9]


def test_worker_serves_a_repository_by_name(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        hub_repos: HubRepos, hub_env: Path) -> None:
    from kvrelay_worker.engine.llm import LLM
    from kvrelay_worker.engine.sampling_params import SamplingParams

    since = len(hub_repos.hub.requests)
    worker = start_worker("hub-worker", model=f"{REPO}@{REVISION}",
                          kv_cache_memory=TINY_KV_BYTES, swap_space_gib=0.25)
    # The worker fetched the revision into the cache this process gave it.
    ref = hub_env / "models--kvrelay-test--tiny-llama" / "refs" / REVISION
    assert ref.is_file()
    assert hub_repos.hub.file_requests(since), "the worker downloaded nothing"
    with Client(clean_redis_url, model=REPO) as client:
        completion = client.generate(prompt_token_ids=PROMPT, max_tokens=8, temperature=0.0,
                                     ignore_eos=True)
    assert completion.model == REPO
    assert worker.alive()
    # The offline API takes the same name (now from the cache: no file is asked for).
    since = len(hub_repos.hub.requests)
    with one_torch_thread():
        llm = LLM(f"{REPO}@{REVISION}", device="cpu", num_kv_blocks=16, max_num_seqs=1)
        (expected,) = llm.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0.0,
                                                            ignore_eos=True))
    assert hub_repos.hub.file_requests(since) == []
    assert llm.engine.model_id == REPO
    assert completion.token_ids == expected.token_ids
