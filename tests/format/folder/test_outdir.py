"""The output folder's rules: temporary names within NAME_MAX, what counts as packshard's."""

from __future__ import annotations

import os

import pytest

from packshard.format.folder.outdir import NAME_MAX, _glob_matches, temp_stem, written_by_packshard


@pytest.mark.parametrize("name", ["out", "o" * 230, "o" * 255, "é" * 127, "数" * 85])
def test_temporary_names_fit_within_name_max(name):
    stem = temp_stem(name)
    for suffix in (f".partial-{2**22}", f".old-{2**32 - 1}", ".lock"):
        assert len(os.fsencode(f".{stem}{suffix}")) <= NAME_MAX
    assert (stem == name) == (len(os.fsencode(name)) <= 235)
    assert temp_stem(name) == stem  # the same name every run: leftovers are found again


def test_long_names_that_share_a_start_get_different_stems():
    assert temp_stem("o" * 250 + "a") != temp_stem("o" * 250 + "b")


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("/d/*.jsonl", "/d/rejects.jsonl", True),
        ("/d/*.jsonl", "/d/out/rejects.jsonl", False),
        ("/d/**/*.jsonl", "/d/a/b/rejects.jsonl", True),
        ("/d/**", "/d/out", True),
        ("/d/*", "/d/.out", False),
        ("/d/.*", "/d/.out", True),
        ("/*/x", "/d/x", True),
    ],
)
def test_glob_matching_of_would_be_output_paths(pattern, path, matches):
    assert _glob_matches(pattern, path) is matches


def test_what_counts_as_a_folder_packshard_wrote(tmp_path, packed_demo_copy):
    mine = tmp_path / "mine"
    mine.mkdir()
    assert written_by_packshard(mine) is None  # empty
    (mine / "shard-00000.parquet").write_text("x")
    assert written_by_packshard(mine) == "holds 'shard-00000.parquet' but no packshard manifest"
    folder = packed_demo_copy
    assert written_by_packshard(folder) is None
    (folder / "README.md").write_text("card")
    assert written_by_packshard(folder) is None
    (folder / "sub").mkdir()
    assert written_by_packshard(folder) == "holds 'sub', which packshard did not write"
    (folder / "sub").rmdir()
    manifest = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text("[" * 100_000)
    assert written_by_packshard(folder).endswith("but no packshard manifest")
    (folder / "manifest.json").write_text(manifest)
