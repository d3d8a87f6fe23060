"""Input specs to files: the glob expansion matches Python's glob, and refuses what it skips."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from packshard.errors import InputError
from packshard.ingest.read.inputs import _glob, expand_inputs, open_regular

TREE = [
    "a.jsonl",
    "b.json",
    "c.parquet",
    "notes.txt",
    ".hidden.jsonl",
    "x/y.jsonl",
    "x/z.jsonl.gz",
    "x/.h/q.jsonl",
    "x/deep/er/w.jsonl",
    ".dot/e.jsonl",
    "[b]racket.jsonl",
]
PATTERNS = [
    "*.jsonl",
    "*",
    "**",
    "**/*.jsonl",
    "x/**",
    "x/*/*/*.jsonl",
    "?.json",
    "[ab].*",
    ".*",
    "x/**/*.jsonl*",
    "**/deep/**/*.jsonl",
    "nothing/*.jsonl",
    "x/*",
]


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for rel in TREE:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("pattern", PATTERNS)
def test_glob_expansion_is_pythons(tree, pattern):
    assert _glob(pattern) == sorted(glob.glob(pattern, recursive=True))
    absolute = str(tree / pattern)
    assert _glob(absolute) == sorted(glob.glob(absolute, recursive=True))


def test_folders_keep_the_documented_order(tree):
    assert [f.path for f in expand_inputs(["x", "."])] == [
        "x/deep/er/w.jsonl",
        "x/y.jsonl",
        "x/z.jsonl.gz",
        "[b]racket.jsonl",
        "a.jsonl",
        "b.json",
        "c.parquet",
    ]


def test_open_regular_refuses_fifos_and_folders_without_blocking(tree):
    os.mkfifo(tree / "p.jsonl")
    for path, kind in (("p.jsonl", "a FIFO"), ("x", "not a regular file")):
        with pytest.raises(InputError) as info:
            open_regular(tree / path, path)
        assert str(info.value) == (
            f"{path}: {kind}, not a regular file (reading it could block forever; remove it "
            "from the inputs)"
        )
    with open_regular(tree / "a.jsonl", "a.jsonl") as fh:
        assert fh.read() == b"{}\n"
