"""Manifest paths are used only when they name a regular file inside the folder."""

from __future__ import annotations

import os

import pytest

from packshard.errors import FormatError
from packshard.format.folder.paths import MISSING, inside_folder

NOT_RELATIVE = "path is not a relative path inside the folder (not read)"


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "shard.parquet").write_text("x")
    (out / "sub" / "f.txt").write_text("x")
    (tmp_path / "secret").write_text("x")
    (out / "inner-link").symlink_to(out / "shard.parquet")
    (out / "outer-link").symlink_to(tmp_path / "secret")
    (out / "dir-link").symlink_to(tmp_path)
    os.mkfifo(out / "pipe")
    return out


@pytest.mark.parametrize(
    ("rel", "problem"),
    [
        ("/etc/hostname", NOT_RELATIVE),
        ("../secret", NOT_RELATIVE),
        ("sub/../../secret", NOT_RELATIVE),
        ("", NOT_RELATIVE),
        ("a\\b", NOT_RELATIVE),
        (5, NOT_RELATIVE),
        (None, NOT_RELATIVE),
        ("outer-link", "is a link to a place outside the folder (not read)"),
        ("dir-link/secret", "is a link to a place outside the folder (not read)"),
        ("pipe", "is not a regular file (not read)"),
        ("sub", "is not a regular file (not read)"),
        ("gone.parquet", MISSING),
    ],
)
def test_paths_that_are_not_regular_files_inside_are_refused(folder, rel, problem):
    with pytest.raises(FormatError) as info:
        inside_folder(folder, rel)
    assert info.value.problem == problem


@pytest.mark.parametrize("rel", ["shard.parquet", "sub/f.txt", "inner-link", "./shard.parquet"])
def test_regular_files_inside_are_returned(folder, rel):
    assert inside_folder(folder, rel) == folder / rel
