"""Quantized checkpoints of SmolLM2, made by llmcompressor and GPTQModel in their environment.

llmcompressor pins an older transformers than the project's, and GPTQModel an older numpy,
so ``make install`` puts them in ``.venv/quant-tools`` (``requirements-quant-tools.txt``
says how): a small environment that reads every other package from the project's venv.
The tests run ``make_compressed_checkpoint.py`` (about 5 s a scheme after 10 s of
imports) or ``make_gptqmodel_checkpoint.py`` (GPTQ, and AWQ in the GEMM packing: 45-85 s a
SmolLM2 checkpoint) there, from SmolLM2's float32 folder or the tiny random Llama's;
``$KVRELAY_TEST_QUANT_TOOLS_PYTHON`` names another interpreter with them.

Like the SmolLM2 folder they start from, the checkpoints live in the real cache
(``$KVRELAY_CACHE_DIR`` or ``~/.cache/kvrelay``, ``quant-checkpoints/<key>``): made once
(~150 s for all of them), then reused. The key covers what decides their bytes: the
script, the tools' pinned versions and the source weights; a stale one is never reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL_PINS = (REPO / "requirements-quant-tools.txt", REPO / "requirements-quant-tools-build.txt")
# What the scripts import from this folder: part of what decides a checkpoint's bytes.
SCRIPT_INPUTS = (Path(__file__).with_name("calibration_text.py"),)
TOOLS_PYTHON = REPO / ".venv" / "quant-tools" / "bin" / "python"
SCRIPT = Path(__file__).with_name("make_compressed_checkpoint.py")
GPTQMODEL_SCRIPT = Path(__file__).with_name("make_gptqmodel_checkpoint.py")
# The source of a checkpoint that is SmolLM2 itself (else a tiny model's name): GPTQ's and
# AWQ's searches cost 45-85 s per SmolLM2 checkpoint on 2 cores and seconds on the tiny
# model, so each format's variants past the first are made from the tiny random Llama.
SMOLLM2 = "smollm2"
TINY_SOURCE = "llama3-rope"


def tools_python() -> Path:
    """The interpreter with llmcompressor (skips the test where there is none)."""
    override = os.environ.get("KVRELAY_TEST_QUANT_TOOLS_PYTHON")
    python = Path(override) if override else TOOLS_PYTHON
    if not python.exists():
        pytest.skip(f"llmcompressor's environment {python} is missing (`make install`)")
    return python


def make_checkpoints(source: Path, root: Path, schemes: list[str], script: Path = SCRIPT
                     ) -> None:
    """``root/SCHEME`` for each scheme: ``source`` quantized by llmcompressor's data-free
    oneshot (all in one process; those already there are kept)."""
    missing = [s for s in schemes if not (root / s / "config.json").is_file()]
    if not missing:
        return
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([str(tools_python()), str(script), str(source), str(root), *missing],
                          capture_output=True, text=True, timeout=600, env=env, check=False,
                          cwd=root)  # GPTQModel writes its logs into ./logs
    if done.returncode:
        raise RuntimeError(f"llmcompressor failed on {missing}:\n{done.stderr[-4000:]}")


def cached_checkpoints(source: Path, schemes: list[str], script: Path = SCRIPT) -> Path:
    """The folder holding ``folder/SCHEME`` for each scheme, made by ``script`` from
    ``source`` once and kept in the cache; a folder appears only once complete."""
    root = _cache_root() / _key(source, script)
    missing = [s for s in schemes if not (root / s / "config.json").is_file()]
    if missing:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root, prefix=".making-") as scratch:
            make_checkpoints(source, Path(scratch), missing, script)
            # each scheme's folder and what the script makes beside it (GPTQ's oracle,
            # ``SCHEME-dequantized``); the config last, as it marks a scheme complete
            for made in sorted(Path(scratch).iterdir(), key=lambda p: p.name in missing):
                if made.is_dir() and made.name.startswith(tuple(missing)):
                    shutil.rmtree(root / made.name, ignore_errors=True)
                    made.rename(root / made.name)
    return root


def checkpoints_from_sources(sources: dict[str, str], smollm2_folder: Path,
                             tiny_model: Callable[[str], Path], script: Path = GPTQMODEL_SCRIPT
                             ) -> Callable[[str], Path]:
    """``get(NAME)`` (or ``get(NAME-dequantized)``): the checkpoint NAME made by ``script``
    from ``sources[NAME]``, ``"smollm2"`` or a tiny model's name; the checkpoints of one
    source are made together, in one process, at the first request for any of them."""

    def get(name: str) -> Path:
        base = name.removesuffix("-dequantized")
        source = sources[base]
        folder = smollm2_folder if source == SMOLLM2 else tiny_model(source)
        together = [other for other, made_from in sources.items() if made_from == source]
        return cached_checkpoints(folder, together, script) / name

    return get


def layer_count(folder: Path) -> int:
    return int(json.loads((folder / "config.json").read_text())["num_hidden_layers"])


def _cache_root() -> Path:
    from kvrelay_worker.loading.cache_layout import cache_root

    return cache_root() / "quant-checkpoints"


def _key(source: Path, script: Path) -> str:
    digest = hashlib.sha256()
    for path in (script, *SCRIPT_INPUTS, *TOOL_PINS, *sorted(source.glob("*.json")),
                 *sorted(source.glob("*.safetensors"))):
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 22), b""):
                digest.update(chunk)
    return f"{script.stem}-{digest.hexdigest()[:16]}"
