"""Input specs to files: the glob expansion matches Python's glob, and refuses what it skips."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from packshard.errors import InputError
from packshard.ingest.read.inputs import _glob, expand_inputs
from packshard.ingest.read.regular import open_regular

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


@pytest.mark.parametrize("spelling", [".", "./", "x", "x/", "x//", "./x/./", "ABS", "ABS//x/"])
def test_walked_paths_are_spelled_as_pathlib_spells_them(tree, spelling):
    spec = spelling.replace("ABS", str(tree))
    os.symlink(tree / "a.jsonl", tree / "x" / "link.jsonl")  # a link: resolved to its target
    walked = sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(spec)
        if not any(d.startswith(".") and d.strip(".") for d in root.split(os.sep))
        for name in names
        if not name.startswith(".") and name.endswith((".jsonl", ".json", ".parquet", ".gz"))
    )
    want: dict[Path, str] = {}
    for path in walked:  # pathlib's spelling, a file reached twice kept at its first place
        want.setdefault(Path(path).resolve(), str(Path(path)))
    files = expand_inputs([spec])
    assert [(f.path, f.real) for f in files] == [(p, r) for r, p in want.items()]
    assert (tree / "a.jsonl") in {f.real for f in files}  # through the link, or itself
