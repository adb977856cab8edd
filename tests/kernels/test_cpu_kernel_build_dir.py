"""Every checkout of the same CPU kernel sources on a machine shares one build folder.

A CI clone or a second worktree must not pay the compile (100-250 s on two cores) again
for sources already built here; the folder's name keys what changes the library (sources,
headers, flags, torch, Python, CPU), so an edit still builds anew.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvrelay_kernels.cpu_kernels import build


def test_two_checkouts_of_the_same_sources_share_one_build_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = build.default_build_dir()
    copy = tmp_path / "other-checkout" / "cpu_kernels"
    shutil.copytree(Path(build.__file__).parent, copy)
    monkeypatch.setattr(build, "_source_dir", lambda: copy)
    assert build.default_build_dir() == here


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
