"""``benchmarks/gpu_check.sh`` without a GPU: its dry run, and a clean stop otherwise.

On a GPU host the script runs the GPU suites and benchmarks (minutes). Here:
- ``--dry-run`` passes with a bundle made by ``gpu_bundle.sh`` (wheels downloaded from
  the package index, SmolLM2's tokenizer): every wheel is there with its needs, and every
  stage's tests collect with only the GPU host's packages and the carried ones importable;
- it fails when one wheel, a wheel's own need, or the tokenizer is taken out;
- an import the host could not satisfy fails under ``gpu_host_env.py``;
- a stage's JUnit report with a skip nobody allowed, or with no test run, fails it;
- without ``--dry-run`` and without CUDA it stops at its CUDA check, status 2.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, env={**os.environ, "PYTHON": sys.executable, **env},
                          capture_output=True, text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh bundle from ``gpu_bundle.sh`` (pip download from the index, the tokenizer)."""
    folder = tmp_path_factory.mktemp("gpu-bundle")
    made = _run(["bash", "benchmarks/gpu_bundle.sh"], KVRELAY_GPU_BUNDLE=str(folder))
    assert made.returncode == 0, made.stderr[-3000:]
    return folder


def _copy_without(bundle: Path, tmp_path: Path, pattern: str) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    removed = list(copy.glob(pattern))
    assert len(removed) == 1, f"{pattern} matched {removed}"
    removed[0].unlink()
    return copy


@pytest.mark.slow
def test_dry_run_passes_with_the_bundle(bundle: Path) -> None:
    result = _run(["bash", "benchmarks/gpu_check.sh", "--dry-run"],
                  KVRELAY_GPU_BUNDLE=str(bundle))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stage kernel_tests collects" in result.stdout
    assert "stage engine_tests collects" in result.stdout
    assert "the bundle is complete and every stage imports" in result.stdout


@pytest.mark.parametrize(("pattern", "complaint"), [
    (".whl/msgspec-*.whl", "no wheel (or more than one) of msgspec"),
    (".whl/rpds_py-*.whl", "needs rpds-py: not on the GPU host, not carried"),
    (".devdata/smollm2-tokenizer/tokenizer.json", "tokenizer.json is missing"),
], ids=["a-wheel", "a-wheels-need", "the-tokenizer"])
def test_dry_run_fails_when_a_bundle_item_is_missing(bundle: Path, tmp_path: Path,
                                                     pattern: str, complaint: str) -> None:
    broken = _copy_without(bundle, tmp_path, pattern)
    result = _run(["bash", "benchmarks/gpu_check.sh", "--dry-run"],
                  KVRELAY_GPU_BUNDLE=str(broken))
    assert result.returncode == 1, result.stdout + result.stderr
    assert complaint in result.stderr


def test_an_import_the_host_lacks_fails_under_the_host_environment(bundle: Path,
                                                                   tmp_path: Path) -> None:
    """The tree's own import of a package neither on the host nor carried is refused;
    carried, the same import works."""
    code = "import jsonschema; print('imported')"
    guard = [sys.executable, "benchmarks/gpu_host_env.py", "--wheels"]
    carried = _run([*guard, str(bundle / ".whl"), "--", "-c", code])
    assert carried.returncode == 0, carried.stderr
    assert "imported" in carried.stdout
    broken = _copy_without(bundle, tmp_path, ".whl/jsonschema-*.whl")
    missing = _run([*guard, str(broken / ".whl"), "--", "-c", code])
    assert missing.returncode != 0
    assert "No module named 'jsonschema' on the GPU host" in missing.stderr


def _junit(tmp_path: Path, cases: str) -> Path:
    report = tmp_path / "report.xml"
    report.write_text(textwrap.dedent(f"""\
        <?xml version="1.0" encoding="utf-8"?>
        <testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>"""))
    return report


PASSED = '<testcase classname="t" name="a"/>'
SKIPPED = '<testcase classname="t" name="{name}"><skipped message="{why}"/></testcase>'


@pytest.mark.parametrize(("cases", "allowed", "rc"), [
    (PASSED, [], 0),
    (PASSED + SKIPPED.format(name="b", why="needs CUDA"), [], 1),
    (PASSED + SKIPPED.format(name="b", why="needs two CUDA devices (cuda:1)"),
     ["needs two CUDA devices"], 0),
    (SKIPPED.format(name="b", why="needs two CUDA devices"), ["needs two CUDA devices"], 1),
    (PASSED + '<testcase classname="t" name="c"><failure message="x"/></testcase>', [], 1),
], ids=["passed", "unexpected-skip", "allowed-skip", "nothing-ran", "failed"])
def test_a_stage_cannot_pass_on_skips(tmp_path: Path, cases: str, allowed: list[str],
                                      rc: int) -> None:
    args = [a for pattern in allowed for a in ("--allow-skip", pattern)]
    result = _run([sys.executable, "benchmarks/gpu_stage_result.py",
                   str(_junit(tmp_path, cases)), *args])
    assert result.returncode == rc, result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs for minutes")
def test_gpu_check_stops_cleanly_without_cuda(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = _run(["bash", "benchmarks/gpu_check.sh"], OUT=str(out), CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 2, result.stderr
    assert "no CUDA device is visible" in result.stderr
    assert "nothing was run" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists(), "a stage started before the CUDA check"
