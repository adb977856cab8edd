"""Each checkout of the CPU kernels builds into a folder of its own.

torch's build file names the sources by absolute path, so two checkouts that shared a
build folder (same sources, flags and torch) rebuilt it in turn: a worker's first job
waited 35-60 s on a compile another checkout had just invalidated.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvrelay_kernels.cpu_kernels import build


def test_two_checkouts_of_the_same_sources_build_in_different_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = build.default_build_dir()
    copy = tmp_path / "other-checkout" / "cpu_kernels"
    shutil.copytree(Path(build.__file__).parent, copy)
    monkeypatch.setattr(build, "_source_dir", lambda: copy)
    there = build.default_build_dir()
    assert there != here
    assert there.parent == here.parent  # the same cache, one folder per checkout


def test_an_edited_header_builds_in_a_new_folder(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The sources include headers; a changed header must not load a stale library."""
    copy = tmp_path / "checkout" / "cpu_kernels"
    shutil.copytree(Path(build.__file__).parent, copy)
    monkeypatch.setattr(build, "_source_dir", lambda: copy)
    before = build.default_build_dir()
    header = copy / build.HEADERS[0]
    header.write_text(header.read_text() + "\n// edited\n")
    assert build.default_build_dir() != before
