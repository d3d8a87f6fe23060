"""Output-folder safety: pack never destroys what it did not write, nor reads what it writes.

``--overwrite`` replaces only a folder packshard wrote; OUT may not be, hold or lie inside an
input, nor be reached by an input glob; a second run on the same OUT fails at once naming the
first; leftovers of interrupted runs are cleaned up and said so; long OUT names work.  Every
refusal is one line, exit 2, and leaves the tree exactly as it was.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from packshard.format.folder.claim import claim_out
from packshard.format.folder.outdir import NAME_MAX, temp_stem
from tests.helpers import changed, pack_from, tree_state

RECORD = json.dumps({"text": "w2 w3 w4"}) + "\n"
NOT_OURS = "; --overwrite only replaces a folder packshard wrote (choose another -o, or empty it)"
OUTSIDE = "(a later run would read its own output; choose an -o outside the inputs)"


pack = pack_from


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text(RECORD * 3)
    return tmp_path


def refused(result: Any, message: str) -> None:
    assert (result.exit_code, result.stderr) == (2, f"error: {message}\n")


# --- --overwrite and the inputs ----------------------------------------------------------------


def test_overwrite_never_replaces_a_folder_packshard_did_not_write(root, word_tokenizer):
    before = tree_state(root)
    for args in (("data", "-o", "data", "--overwrite"), ("data/a.jsonl", "-o", "data")):
        refused(
            pack(root, word_tokenizer, *args),
            f"data: output folder holds 'a.jsonl' but no packshard manifest{NOT_OURS}",
        )
    assert changed(before, tree_state(root)) == []
    assert pack(root, word_tokenizer, "data", "-o", "out").exit_code == 0
    (root / "out" / "notes.txt").write_text("mine")  # a packshard folder, plus a file of mine
    before = tree_state(root)
    refused(
        pack(root, word_tokenizer, "data", "-o", "out", "--overwrite"),
        f"out: output folder holds 'notes.txt', which packshard did not write{NOT_OURS}",
    )
    assert changed(before, tree_state(root)) == []
    (root / "out" / "notes.txt").unlink()
    assert pack(root, word_tokenizer, "data", "-o", "out", "--overwrite").exit_code == 0


def test_out_may_not_be_inside_hold_or_be_reached_by_an_input(root, word_tokenizer):
    assert pack(root, word_tokenizer, "data", "-o", "old").exit_code == 0
    before = tree_state(root)
    cases = [
        (
            ("data", "-o", "data/out"),
            f"data/out: output folder lies inside the input folder data {OUTSIDE}",
        ),
        (
            ("data", "-o", "."),
            f".: output folder holds 'data', 'old' but no packshard manifest{NOT_OURS}",
        ),
        (
            ("old/rejects.jsonl", "-o", "old", "--overwrite"),
            "old: output folder holds the input old/rejects.jsonl (choose an -o outside the "
            "inputs)",
        ),
        (
            ("data/**/*.jsonl", "-o", "data/x/out"),
            "data/x/out: the input pattern data/**/*.jsonl reaches the output folder (a later run "
            "would read its own output; choose an -o outside it)",
        ),
        (
            ("*/*.jsonl", "-o", "new"),
            "new: the input pattern */*.jsonl reaches the output folder (a later run would read "
            "its own output; choose an -o outside it)",
        ),
        (
            ("d*", "-o", "data2"),
            "data2: the input pattern d* reaches the output folder (a later run would read its own "
            "output; choose an -o outside it)",
        ),
    ]
    for args, message in cases:
        refused(pack(root, word_tokenizer, *args), message)
    assert changed(before, tree_state(root)) == []
    link = root / "alias"
    link.symlink_to(root / "data")
    refused(
        pack(root, word_tokenizer, "data", "-o", "alias/out"),
        f"alias/out: output folder lies inside the input folder data {OUTSIDE}",
    )


def test_out_that_is_a_file_or_under_one(root, word_tokenizer):
    (root / "f").write_text("x")
    before = tree_state(root)
    refused(pack(root, word_tokenizer, "data", "-o", "f"), "f: not a folder; choose another -o")
    refused(
        pack(root, word_tokenizer, "data", "-o", "f/sub"),
        "f/sub: not a folder (f is a file); choose another -o",
    )
    assert changed(before, tree_state(root)) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_parent_is_a_usage_error(root, word_tokenizer):
    (root / "ro").mkdir(mode=0o555)
    result = pack(root, word_tokenizer, "data", "-o", "ro/out")
    refused(
        result,
        "ro/out: cannot write beside the output folder (Permission denied); choose another -o",
    )


def test_a_lock_file_that_cannot_be_made_is_a_usage_error(root, word_tokenizer, monkeypatch):
    import packshard.format.folder.claim as outdir

    real = os.open

    def deny(path: Any, *args: Any) -> int:
        if str(path).endswith(".lock"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args)

    monkeypatch.setattr(outdir.os, "open", deny)
    refused(
        pack(root, word_tokenizer, "data", "-o", "out"),
        "out: cannot write beside the output folder (Permission denied); choose another -o",
    )
    assert not (root / "out").exists()


# --- the lock, leftovers of interrupted runs ---------------------------------------------------


def test_a_second_run_on_the_same_out_fails_at_once_naming_the_first(root, word_tokenizer):
    fd = os.open(root / ".out.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{os.getpid()} {socket.gethostname()} export\n".encode())
    try:
        before = tree_state(root)
        refused(  # the holder's command, not this one's
            pack(root, word_tokenizer, "data", "-o", "out"),
            f"out: another packshard export (process {os.getpid()} on {socket.gethostname()}) is "
            "writing this output folder (lock .out.lock); wait for it to finish or choose "
            "another -o",
        )
        assert changed(before, tree_state(root)) == []
    finally:
        os.close(fd)
    os.unlink(root / ".out.lock")
    assert pack(root, word_tokenizer, "data", "-o", "out").exit_code == 0
    assert sorted(p.name for p in root.iterdir()) == ["data", "out"]  # lock released and gone


def dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(child.stdout)


def test_leftovers_of_dead_runs_are_removed_and_said_so(root, word_tokenizer):
    assert pack(root, word_tokenizer, "data", "-o", "out").exit_code == 0
    pid = dead_pid()
    (root / f".out.partial-{pid}").mkdir()
    (root / f".out.partial-{pid}" / "shard-00000.parquet").write_text("half")
    (root / f".out.old-{pid}").mkdir()
    live = root / f".out.partial-{os.getppid()}"  # a running process: left alone
    live.mkdir()
    result = pack(root, word_tokenizer, "data", "-o", "out", "--overwrite")
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"warning: removed .out.old-{pid} left by an interrupted run (process {pid})\n"
        f"warning: removed .out.partial-{pid} left by an interrupted run (process {pid})\n"
    )
    assert sorted(p.name for p in root.iterdir()) == [live.name, "data", "out"]


def test_an_out_lost_in_the_middle_of_a_swap_is_put_back(root, word_tokenizer):
    assert pack(root, word_tokenizer, "data", "-o", "out").exit_code == 0
    pid = dead_pid()
    os.replace(root / "out", root / f".out.old-{pid}")  # killed between the two renames
    result = pack(root, word_tokenizer, "data", "-o", "out")
    assert result.exit_code == 2
    assert result.stderr == (
        f"warning: put back out from .out.old-{pid} (a replace was interrupted)\n"
        "error: out: output folder exists and is not empty (use --overwrite)\n"
    )
    assert (root / "out" / "manifest.json").is_file()
    assert sorted(p.name for p in root.iterdir()) == ["data", "out"]


# --- long names --------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [250, 255])
def test_a_legal_long_out_name_works(root, word_tokenizer, length):
    name = "o" * length
    assert len(f".{temp_stem(name)}.partial-4194304".encode()) <= NAME_MAX
    with claim_out(str(root / name), False, ["data"], []) as claim:
        assert len(claim.tmp.name.encode()) <= NAME_MAX
        assert claim.tmp.is_dir()
    result = pack(root, word_tokenizer, "data", "-o", name)
    assert result.exit_code == 0, result.output
    assert (root / name / "manifest.json").is_file()
    result = pack(root, word_tokenizer, "data", "-o", name, "--overwrite")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in root.iterdir()) == sorted(["data", name])
