"""A folder's tokenizer through the remembered class equals ``AutoTokenizer``'s, and the
second load skips importing ``transformers.models`` and the config class (the point).

Every tiny family's folder (SmolLM2's tokenizer files under each family's config, so
``AutoTokenizer`` picks by model type and hub class as it would for that family) and
SmolLM2's own: the first load asks ``AutoTokenizer`` and remembers, the second builds the
remembered class; both must equal a fresh ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.tiny_models import TINY_MODEL_NAMES
from helpers.tokenizer_checks import assert_same_tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from kvrelay_worker.loading import tokenizer_choice
from kvrelay_worker.loading.tokenizer_choice import folder_digest, load_folder_tokenizer


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("KVRELAY_CACHE_DIR", str(cache))
    return cache


def auto(folder: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def remembered(folder: Path) -> Path:
    digest = folder_digest(folder)
    assert digest is not None
    return tokenizer_choice.choices_dir() / f"{digest}.json"


@pytest.mark.parametrize("name", TINY_MODEL_NAMES)
def test_remembered_class_equals_auto_tokenizer(
        name: str, tiny_model: Callable[[str], Path], empty_cache: Path) -> None:
    folder = tiny_model(name)
    reference = auto(folder)
    first = load_folder_tokenizer(folder)
    record = json.loads(remembered(folder).read_text())
    assert (record["module"], record["name"]) == (type(reference).__module__,
                                                  type(reference).__name__)
    second = load_folder_tokenizer(folder)
    for ours in (first, second):
        assert_same_tokenizer(ours, reference)
        assert ours.init_kwargs == reference.init_kwargs


def test_smollm2_through_the_remembered_class(smollm2_folder: Path, empty_cache: Path) -> None:
    reference = auto(smollm2_folder)
    load_folder_tokenizer(smollm2_folder)
    assert remembered(smollm2_folder).exists()
    assert_same_tokenizer(load_folder_tokenizer(smollm2_folder), reference)


def test_a_changed_file_is_asked_again(tiny_model: Callable[[str], Path], tmp_path: Path,
                                       empty_cache: Path) -> None:
    source = tiny_model("llama-mqa")
    folder = tmp_path / "copy"
    folder.mkdir()
    for entry in source.iterdir():
        (folder / entry.name).symlink_to(entry)
    load_folder_tokenizer(folder)
    before = folder_digest(folder)
    (folder / "tokenizer_config.json").unlink()
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["model_max_length"] = 77
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert folder_digest(folder) != before
    assert not remembered(folder).exists()
    assert load_folder_tokenizer(folder).model_max_length == 77
    assert remembered(folder).exists()


def test_a_broken_record_falls_back(tiny_model: Callable[[str], Path], empty_cache: Path) -> None:
    folder = tiny_model("llama-mqa")
    record = remembered(folder)
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"module": "transformers", "name": "NoSuchTokenizer",
                                  "kwargs": {}}))
    assert_same_tokenizer(load_folder_tokenizer(folder), auto(folder))
    record.write_text(json.dumps({"module": "json", "name": "JSONDecoder",  # no tokenizer
                                  "kwargs": {}}))
    assert_same_tokenizer(load_folder_tokenizer(folder), auto(folder))


def test_a_class_from_outside_transformers_is_not_remembered(empty_cache: Path) -> None:
    class OwnCode(PreTrainedTokenizerBase):
        pass

    tokenizer_choice._remember("d" * 64, OwnCode, {})
    assert not (tokenizer_choice.choices_dir() / f"{'d' * 64}.json").exists()


def _model_packages_imported(folder: Path, cache: Path) -> bool:
    code = ("import sys\nfrom pathlib import Path\n"
            "from kvrelay_worker.loading.tokenizer import load_tokenizer\n"
            f"load_tokenizer(Path({str(folder)!r}))\n"
            "print('transformers.models' in sys.modules)\n")
    env = dict(os.environ, KVRELAY_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] == "True"


def test_the_second_start_skips_the_model_packages(tiny_model: Callable[[str], Path],
                                                 empty_cache: Path) -> None:
    folder = tiny_model("llama-mqa")
    assert _model_packages_imported(folder, empty_cache)  # the first asks AutoTokenizer
    assert not _model_packages_imported(folder, empty_cache)
