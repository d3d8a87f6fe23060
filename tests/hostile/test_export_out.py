"""``export``'s destination has ``pack``'s output-folder guard, with the same messages.

Never the input pack, inside it or holding it; never a folder packshard did not write (a
fake manifest proves nothing); ``-o ref/../ref`` resolved once; leftovers of interrupted runs
of either command cleaned and an interrupted replace put back.  Every refusal is one line,
exit 2, and leaves the tree exactly as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from packshard.cli.commands import main
from tests.helpers import changed, tree_state
from tests.hostile.test_output_folder import NOT_OURS, OUTSIDE, dead_pid, pack, refused


def export(root: Path, *args: Any) -> Any:
    """Run ``packshard export`` in-process from ``root``."""
    cwd = os.getcwd()
    os.chdir(root)
    try:
        argv = ["export", *map(str, args)]
        return CliRunner().invoke(main, argv, prog_name="packshard", catch_exceptions=False)
    finally:
        os.chdir(cwd)


@pytest.fixture
def proj(tmp_path: Path, word_tokenizer: Path) -> Path:
    """``proj/`` holding ``data/a.jsonl``, its pack ``src/`` and a user's ``notes/``."""
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    (root / "data" / "a.jsonl").write_text(json.dumps({"text": "w2 w3 w4"}) + "\n" * 1)
    (root / "notes").mkdir()
    (root / "notes" / "thesis.txt").write_text("years of work")
    assert pack(root, word_tokenizer, "data", "-o", "src").exit_code == 0
    return root


def test_export_never_overlaps_its_input_pack(proj):
    before = tree_state(proj.parent)
    cases = [
        (
            ("src", "-o", "src", "--overwrite"),
            f"src: output folder lies inside the input folder src {OUTSIDE}",
        ),
        (
            ("src", "-o", "src/exp"),
            f"src/exp: output folder lies inside the input folder src {OUTSIDE}",
        ),
        (
            ("src", "-o", "../proj", "--overwrite"),
            f"../proj: output folder holds the input folder src {OUTSIDE}",
        ),
        (
            ("src", "-o", ".", "--overwrite"),
            f".: output folder holds the input folder src {OUTSIDE}",
        ),
    ]
    for args, message in cases:
        a, *rest = args
        refused(export(proj, a, "--to", "unpacked", *rest), message)
    assert changed(before, tree_state(proj.parent)) == []


def test_export_never_replaces_a_folder_packshard_did_not_write(proj):
    before = tree_state(proj)
    refused(
        export(proj, "src", "--to", "unpacked", "-o", "notes", "--overwrite"),
        f"notes: output folder holds 'thesis.txt' but no packshard manifest{NOT_OURS}",
    )
    fake = {"dataset_id": "ab", "files": {"e": {"path": "thesis.txt"}}, "shards": []}
    (proj / "notes" / "manifest.json").write_text(json.dumps(fake))
    before = tree_state(proj)
    refused(
        export(proj, "src", "--to", "unpacked", "-o", "notes", "--overwrite"),
        "notes: output folder holds 'manifest.json', 'thesis.txt' but no packshard "
        f"manifest{NOT_OURS}",
    )
    assert changed(before, tree_state(proj)) == []
    (proj / "notes" / "export.json").write_text(json.dumps({"files": {"thesis.txt": "0" * 64}}))
    (proj / "notes" / "manifest.json").unlink()
    before = tree_state(proj)
    refused(
        export(proj, "src", "--to", "unpacked", "-o", "notes", "--overwrite"),
        "notes: output folder holds 'export.json', 'thesis.txt' but no packshard export "
        f"record{NOT_OURS}",
    )
    assert changed(before, tree_state(proj)) == []


def test_an_export_replaces_its_own_earlier_export_only(proj):
    assert export(proj, "src", "--to", "unpacked", "-o", "exp").exit_code == 0
    refused(
        export(proj, "src", "--to", "unpacked", "-o", "exp"),
        "exp: output folder exists and is not empty (use --overwrite)",
    )
    result = export(proj, "src", "--to", "megatron", "-o", "exp", "--overwrite")
    assert result.exit_code == 0, result.output
    (proj / "exp" / "mine.txt").write_text("x")
    refused(
        export(proj, "src", "--to", "unpacked", "-o", "exp", "--overwrite"),
        f"exp: output folder holds 'mine.txt', which packshard did not write{NOT_OURS}",
    )


def test_a_dotted_out_is_resolved_once(proj):
    assert export(proj, "src", "--to", "unpacked", "-o", "ref").exit_code == 0
    result = export(proj, "src", "--to", "unpacked", "-o", "ref/../ref", "--overwrite")
    assert result.exit_code == 0, result.output
    assert (proj / "ref" / "export.json").is_file()
    assert sorted(p.name for p in proj.iterdir()) == ["data", "notes", "ref", "src"]


def test_export_cleans_leftovers_and_puts_back_an_interrupted_replace(proj):
    assert export(proj, "src", "--to", "unpacked", "-o", "exp").exit_code == 0
    pid = dead_pid()
    (proj / f".exp.partial-{pid}").mkdir()
    os.replace(proj / "exp", proj / f".exp.old-{pid}")  # killed between the two renames
    result = export(proj, "src", "--to", "unpacked", "-o", "exp")
    assert result.exit_code == 2
    assert result.stderr == (
        f"warning: put back exp from .exp.old-{pid} (a replace was interrupted)\n"
        f"warning: removed .exp.partial-{pid} left by an interrupted run (process {pid})\n"
        "error: exp: output folder exists and is not empty (use --overwrite)\n"
    )
    assert (proj / "exp" / "export.json").is_file()
    assert sorted(p.name for p in proj.iterdir()) == ["data", "exp", "notes", "src"]


def test_a_second_export_on_the_same_out_is_refused(proj):
    import fcntl

    fd = os.open(proj / ".exp.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        result = export(proj, "src", "--to", "unpacked", "-o", "exp")
        assert result.exit_code == 2
        assert "error: exp: another packshard run is writing" in result.stderr
    finally:
        os.close(fd)


STOPPED = """
import os, signal, sys
import packshard.export.run as run
# as in a terminal: the test process may pass SIGHUP on ignored (nohup; seen in a full run)
signal.signal(signal.{sig}, signal.SIG_DFL)
real = run.write_unpacked
def stopped(*args):
    real(*args)  # the partial folder holds files now
    os.kill(os.getpid(), signal.{sig})
    raise AssertionError("the signal did not stop the export")
run.write_unpacked = stopped
from packshard.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_signal_during_export_removes_the_partial_and_the_lock(proj, sig):
    import signal
    import subprocess
    import sys

    before = tree_state(proj)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    args = ["export", "src", "--to", "unpacked", "-o", "exp"]
    done = subprocess.run(  # a process of its own: the signal's default action is its to take
        [sys.executable, "-c", STOPPED.format(sig=sig), *args],
        cwd=proj, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (
        128 + getattr(signal, sig),
        f"error: stopped by {sig} (the partial output was removed)\n",
    )
    assert changed(before, tree_state(proj)) == []  # no partial, no lock, no exp
