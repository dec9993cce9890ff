"""open_beneath: every component resolved beneath the root at open time, no symlink followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from koordqos.errors import UnsafePathError
from koordqos.fs import open_root, read_beneath, split_beneath, write_beneath


def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "a/b").mkdir(parents=True)
    (root / "a/b/f").write_text("1\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/f").write_text("secret\n")
    return root


def test_reads_and_writes_beneath_a_path_or_an_fd(tmp_path: Path) -> None:
    root = tree(tmp_path)
    assert read_beneath(root, "a/b/f") == "1\n"
    fd = open_root(root)
    try:
        write_beneath(fd, "a/b/f", "2")
        assert read_beneath(fd, "a/b/f") == "2"
    finally:
        os.close(fd)


@pytest.mark.parametrize("rel", ["", "/a/b/f", "a/../a/b/f", "a/./b/f", "a//b/f", "a/b/"])
def test_non_plain_components_are_refused(rel: str) -> None:
    with pytest.raises(UnsafePathError):
        split_beneath(rel)


def test_symlinked_dir_component_is_refused(tmp_path: Path) -> None:
    root = tree(tmp_path)
    os.symlink(tmp_path / "outside", root / "a/link")
    with pytest.raises(UnsafePathError, match="symlink 'link'"):
        read_beneath(root, "a/link/f")
    with pytest.raises(UnsafePathError):
        write_beneath(root, "a/link/f", "owned")
    assert (tmp_path / "outside/f").read_text() == "secret\n"


def test_symlinked_leaf_is_refused(tmp_path: Path) -> None:
    root = tree(tmp_path)
    os.symlink(tmp_path / "outside/f", root / "a/b/lf")
    with pytest.raises(UnsafePathError, match="symlink 'lf'"):
        write_beneath(root, "a/b/lf", "owned")
    assert (tmp_path / "outside/f").read_text() == "secret\n"


def test_missing_component_is_an_os_error(tmp_path: Path) -> None:
    root = tree(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_beneath(root, "a/nope/f")
    with pytest.raises(NotADirectoryError):
        read_beneath(root, "a/b/f/g")  # a regular file used as a dir is no symlink: plain OSError


def test_write_never_creates_a_file(tmp_path: Path) -> None:
    root = tree(tmp_path)
    with pytest.raises(FileNotFoundError):
        write_beneath(root, "a/b/new", "1")
    assert not (root / "a/b/new").exists()
