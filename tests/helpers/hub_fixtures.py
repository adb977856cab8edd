"""Repositories served by a local hub (helpers.hub_server), and a process environment that
downloads from it into a private Hugging Face cache (registered from tests/conftest.py).

The repositories, built once per session from tiny random models:

- ``REPO``: a checkpoint like a real one (config, SmolLM2's tokenizer files, safetensors)
  with files the loader must not fetch beside it (a pickled copy, ONNX, a README);
  its branch ``v2`` holds other weights (another seed);
- ``GGUF_REPO``: two GGUF files of one model, tagged Q4_K_M and Q8_0 in their names;
- ``GATED_REPO``: ``REPO``'s files, downloadable only with ``TOKEN``;
- ``PICKLED_REPO``: a config and ``pytorch_model.bin`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.hub_server import LocalHub

REPO = "kvrelay-test/tiny-llama"
REVISION = "v2"
GGUF_REPO = "kvrelay-test/tiny-llama-GGUF"
GATED_REPO = "kvrelay-test/gated-llama"
PICKLED_REPO = "kvrelay-test/pickled-llama"
MISSING_REPO = "kvrelay-test/no-such-model"
TOKEN = "hf_kvrelay_test_token"
TINY = "llama-mqa"
# Files a real repository carries that the loader never reads.
NOT_FOR_THE_LOADER = {
    "pytorch_model.bin": b"\x80\x02pickled weights: never fetched",
    "onnx/model.onnx": b"onnx graph: never fetched",
    "README.md": b"# tiny-llama\n",
}
# The python gguf package writes no K-quants: Q4_0 blocks stand in for Q4_K_M, whose
# name is all the picker reads.
GGUF_FILES = {"tiny-llama-Q4_K_M.gguf": "Q4_0", "tiny-llama-Q8_0.gguf": "Q8_0"}


@dataclass(frozen=True)
class HubRepos:
    """The running hub and the local folders its repositories were published from."""

    hub: LocalHub
    main: Path  # REPO at main (and GATED_REPO)
    v2: Path  # REPO at REVISION
    ggufs: dict[str, Path]  # GGUF_REPO's files by name


@pytest.fixture(scope="session")
def hub_repos(tiny_model: Callable[[str], Path], tokenizer_folder: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubRepos]:
    import gguf

    from helpers.tiny_gguf import TINY_VOCAB_SIZE, write_gguf_from_hf
    from helpers.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("hub-repos")
    main = tiny_model(TINY)
    v2 = build_tiny_model(TINY, root / "v2", tokenizer_folder=tokenizer_folder, seed=1)
    small = build_tiny_model(TINY, root / "small-vocab", vocab_size=TINY_VOCAB_SIZE)
    ggufs = {name: write_gguf_from_hf(small, root / name, gguf.GGMLQuantizationType[qtype])
             for name, qtype in GGUF_FILES.items()}
    hub = LocalHub().start()
    try:
        hub.publish_folder(REPO, main, extra=NOT_FOR_THE_LOADER)
        hub.publish_folder(REPO, v2, revision=REVISION, extra=NOT_FOR_THE_LOADER)
        hub.publish(GGUF_REPO, {**{n: p.read_bytes() for n, p in ggufs.items()},
                                "README.md": b"# GGUF\n"})
        hub.publish_folder(GATED_REPO, main)
        hub.gate(GATED_REPO, TOKEN)
        hub.publish(PICKLED_REPO, {"config.json": (main / "config.json").read_bytes(),
                                   **NOT_FOR_THE_LOADER})
        yield HubRepos(hub, main, v2, ggufs)
    finally:
        hub.stop()


@pytest.fixture
def hub_env(hub_repos: HubRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process (and the workers it starts) downloads from the local hub into a fresh
    Hugging Face cache, with no token and online; returns that cache folder."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-home" / "hub"
    monkeypatch.setenv("HF_ENDPOINT", hub_repos.hub.url)
    monkeypatch.setenv("HF_HOME", str(cache.parent))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("KVRELAY_CACHE_DIR", str(tmp_path / "kvrelay-cache"))
    for variable in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE",
                     "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(variable, raising=False)
    # What huggingface_hub read from the environment when it was imported: a developer's
    # stored login or offline setting must not leak into these tests.
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-stored-token"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return cache
