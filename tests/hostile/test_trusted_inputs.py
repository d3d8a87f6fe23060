"""Inputs and output folders that used to pass silently, or to fail after a false claim.

KTO labels that are not booleans are refused under ``--format auto`` as under ``--format
kto`` (never packed as plain chat, the "bad answer" trained as a good one); ``-o .`` works
from an empty folder and from inside a pack; a read-only OUT is refused in one line without
leaving a hidden copy, and a leftover that cannot be removed is never said to be removed; a
decompression bomb stops the run with its one line and no native thread left to abort it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from packshard.errors import OutputError
from packshard.format.folder.claim import claim_out
from tests.helpers import SHARED_DATA, changed, pack_from, reject_lines, tree_state

RECORD = json.dumps({"text": "w2 w3 w4"}) + "\n"


pack, rejects = pack_from, reject_lines


# --- KTO labels: one reading under auto and under --format kto ---------------------------------


def kto(label: Any, answer: str = "w3") -> dict[str, Any]:
    turns = [{"role": "user", "content": "w2"}, {"role": "assistant", "content": answer}]
    return {"messages": turns, "label": label}


@pytest.mark.parametrize("fmt", ["auto", "kto"])
def test_kto_labels_that_are_not_booleans_are_refused_with_their_line(
    tmp_path, fmt, demo_tokenizer
):
    records = [kto("false"), kto("False"), kto(0), kto("0"), kto(True), kto(False)]
    (tmp_path / "k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = pack(tmp_path, demo_tokenizer, "k.jsonl", "--template", "chatml", "--format", fmt,
                  "--max-seq-len", "64", "--max-reject-rate", "1", "-o", "out")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    fix = "(write the KTO label as a JSON boolean, or rename the field if it is not one)"
    shown = ['a string ("false")', 'a string ("False")', "a number (0)", 'a string ("0")']
    assert rejects(tmp_path / "out") == [
        (line, "invalid_content", f"'label' must be true or false, got {what} {fix}")
        for line, what in enumerate(shown, start=1)
    ]
    import pyarrow.parquet as pq

    labels = pq.read_table(tmp_path / "out" / "shard-00000.parquet")["kto_label"].to_pylist()
    assert sorted(v for row in labels for v in row) == [0, 1]  # the two boolean ones only


# --- -o . : the work folder is named from the resolved OUT ----------------------------------------


def test_dot_as_out_packs_into_an_empty_current_folder(tmp_path, word_tokenizer):
    (tmp_path / "a.jsonl").write_text(RECORD * 3)
    here = tmp_path / "here"
    here.mkdir()
    inode = here.stat().st_ino
    result = pack(here, word_tokenizer, "../a.jsonl", "-o", ".")
    assert result.exit_code == 0, result.stderr
    assert here.stat().st_ino == inode  # filled, not swapped: the shell's folder stays valid
    assert (here / "manifest.json").is_file() and not (here / "..units").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "here"]  # nothing beside


def test_dot_as_out_replaces_the_pack_it_is_run_in(tmp_path, word_tokenizer):
    (tmp_path / "a.jsonl").write_text(RECORD * 3)
    assert pack(tmp_path, word_tokenizer, "a.jsonl", "-o", "p").exit_code == 0
    (tmp_path / "a.jsonl").write_text(RECORD * 5)
    result = pack(tmp_path / "p", word_tokenizer, "../a.jsonl", "-o", ".", "--overwrite")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["stats"]["records"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "p"]
    assert not list((tmp_path / "p").glob(".*"))  # no ..units inside OUT
    again = pack(tmp_path / "p", word_tokenizer, "../a.jsonl", "-o", ".", "--overwrite")
    assert again.exit_code == 0, again.stderr  # and it can be replaced again


# --- a read-only OUT: refused in one line, no hidden copy --------------------------------------


def _packed(tmp_path: Path, tokenizer: Path) -> Path:
    (tmp_path / "a.jsonl").write_text(RECORD * 3)
    assert pack(tmp_path, tokenizer, "a.jsonl", "-o", "out").exit_code == 0
    return tmp_path / "out"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through mode 555")
def test_a_read_only_out_is_refused_without_a_hidden_copy(tmp_path, word_tokenizer):
    out = _packed(tmp_path, word_tokenizer)
    out.chmod(0o555)
    try:
        before = tree_state(tmp_path)
        result = pack(tmp_path, word_tokenizer, "a.jsonl", "-o", "out", "--overwrite")
        assert changed(before, tree_state(tmp_path)) == []
    finally:
        out.chmod(0o755)
    assert (result.exit_code, result.stderr) == (
        2,
        "error: out: the output folder is read-only, so the pack cannot be written or replaced "
        "there (make it writable with chmod -R u+w, or choose another -o)\n",
    )


def test_an_immutable_out_is_refused_without_a_hidden_copy_even_for_root(tmp_path, word_tokenizer):
    """Root ignores mode 555 but not the immutable flag: the real refusal, as root runs it."""
    import shutil
    import subprocess

    out = _packed(tmp_path, word_tokenizer)
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(out)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available on this file system")
    try:
        before = tree_state(tmp_path)
        result = pack(tmp_path, word_tokenizer, "a.jsonl", "-o", "out", "--overwrite")
        assert changed(before, tree_state(tmp_path)) == []
    finally:
        subprocess.run([chattr, "-i", str(out)], check=True)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: out: the output folder is read-only")
    assert result.stderr.count("\n") == 1


def test_an_out_this_process_cannot_write_is_refused(tmp_path, word_tokenizer, monkeypatch):
    out = _packed(tmp_path, word_tokenizer)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if Path(p) == out else real(p, m))
    before = tree_state(tmp_path)
    result = pack(tmp_path, word_tokenizer, "a.jsonl", "-o", "out", "--overwrite")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: out: the output folder is read-only")
    assert changed(before, tree_state(tmp_path)) == []


def _undeletable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the removal of an old OUT fail as a read-only one does (root ignores modes)."""
    import packshard.format.folder.claim as claim

    real = claim.shutil.rmtree

    def rmtree(path: Any, onerror: Any = None, **kwargs: Any) -> None:
        if ".old-" not in Path(path).name:
            return real(path, onerror=onerror, **kwargs)
        denied = PermissionError(13, "Permission denied")
        onerror(os.unlink, str(path), (PermissionError, denied, None))

    monkeypatch.setattr(claim.shutil, "rmtree", rmtree)


def test_an_old_out_that_cannot_be_removed_fails_the_replace(tmp_path, word_tokenizer, monkeypatch):
    _packed(tmp_path, word_tokenizer)
    _undeletable(monkeypatch)
    result = pack(tmp_path, word_tokenizer, "a.jsonl", "-o", "out", "--overwrite")
    assert result.exit_code == 2
    old = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.old-")]
    assert len(old) == 1
    assert result.stderr == (
        "error: out: the new pack is in place, but the old one could not be removed: "
        f"{old[0]} beside it (Permission denied); make it writable and remove it\n"
    )


def test_a_leftover_that_cannot_be_removed_is_never_said_removed(tmp_path, monkeypatch):
    (tmp_path / "out").mkdir()  # OUT is there: the leftover is removed, not put back
    (tmp_path / ".out.old-999999999").mkdir()
    _undeletable(monkeypatch)
    notes: list[str] = []
    with pytest.raises(OutputError) as caught, claim_out(str(tmp_path / "out"), False, [], [],
                                                       notes.append):  # fmt: skip
        pass
    assert str(caught.value) == (
        f"{tmp_path / 'out'}: cannot remove .out.old-999999999 beside it, left by an "
        "interrupted run (Permission denied); make it writable and remove it"
    )
    assert notes == []


# --- a decompression bomb: one line, no abort ------------------------------------------------


def test_the_encoder_is_loaded_on_a_thread_the_interpreter_waits_for(demo_tokenizer):
    from packshard.ingest.tokens.backends import warm_encoder
    from packshard.ingest.tokens.tokenizer import load_tokenizer

    bundle = load_tokenizer(str(demo_tokenizer))
    before = set(threading.enumerate())
    warm_encoder(bundle, "auto")
    started = [t for t in threading.enumerate() if t not in before]
    for thread in started:
        assert not thread.daemon  # shut down mid-load, a daemon thread aborts the process
        thread.join()


@pytest.mark.skipif(not (SHARED_DATA / "tokenizers" / "phi-2").is_dir(), reason="no shared data")
def test_a_zstd_bomb_exits_with_its_line_and_no_abort(tmp_path):
    import zstandard

    line = json.dumps({"text": "a b"}).encode() + b"\n"
    with (
        open(tmp_path / "bomb.jsonl.zst", "wb") as raw,
        zstandard.ZstdCompressor(level=1).stream_writer(raw) as fh,
    ):
        fh.write(line + b"x" * (64 << 20) + b"\n" + line)
    code = "import sys; from packshard.cli import main; sys.exit(main())"
    args = ["pack", "bomb.jsonl.zst", "-t", str(SHARED_DATA / "tokenizers" / "phi-2")]
    args += ["--max-seq-len", "64", "--no-progress", "-o", "out"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for _ in range(3):  # the fast encoder's load is still under way when the bomb is found
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 1, done.stderr  # a data failure, exit 1
        assert "FATAL" not in done.stderr
        assert done.stderr.startswith("error: bomb.jsonl.zst: expands more than 200x")
        assert done.stderr.count("\n") == 1


def test_a_link_where_the_work_folder_goes_is_refused_in_one_line(tmp_path, word_tokenizer):
    (tmp_path / "a.jsonl").write_text(RECORD * 3)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".out.units").symlink_to("elsewhere")
    result = pack(tmp_path, word_tokenizer, "a.jsonl", "-o", "out")
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: {tmp_path / '.out.units'}: a link, where pack keeps its work units beside the "
        "output folder (remove it, or choose another -o)\n",
    )
    assert (tmp_path / ".out.units").is_symlink() and not (tmp_path / "out").exists()


def test_cr_only_line_endings_are_named_as_such(tmp_path, word_tokenizer):
    (tmp_path / "mac.jsonl").write_bytes(
        RECORD.strip().encode() * 1 + b"\r" + RECORD.strip().encode() + b"\r"
    )
    result = pack(tmp_path, word_tokenizer, "mac.jsonl", "-o", "out")
    assert result.exit_code == 1
    assert (
        f"(likely cause: {tmp_path / 'mac.jsonl'} ends its lines with CR alone (classic Mac line "
        "endings): JSON Lines needs LF (convert them, e.g. tr '\\r' '\\n'))"
    ) in result.stderr
    assert "JSON array" not in result.stderr


# --- a template that runs away on every record: the run stops early ------------------------------

LOOP = "{% for m in messages %}{% for i in range(99999) %}{% for j in range(99999) %}"
LOOP += "{% endfor %}{% endfor %}{{ m.content }}{% endfor %}"


def test_a_template_that_runs_away_on_every_record_stops_the_run_early(tmp_path, demo_tokenizer):
    from packshard.ingest.stream import RUNAWAY_RECORDS

    (tmp_path / "loop.jinja").write_text(LOOP)
    record = json.dumps(kto(None)) + "\n"  # a plain chat record (no label)
    (tmp_path / "c.jsonl").write_text(record * 40)
    result = pack(tmp_path, demo_tokenizer, "c.jsonl", "--template", "loop.jinja",
                  "--template-timeout", "0.2", "--max-seq-len", "64", "-o", "out")  # fmt: skip
    assert (result.exit_code, result.stderr) == (
        2,
        "error: loop.jinja: the template ran out of its budget (0.2 s, or its loop steps) on "
        f"each of the first {RUNAWAY_RECORDS} records and rendered none: it loops whatever the "
        "record (fix it, or use --template-timeout to allow more)\n",
    )
    assert not (tmp_path / "out").exists()


def test_a_template_that_finishes_once_is_never_stopped_early(tmp_path, demo_tokenizer):
    short = '{% if messages[1].content == "w3" %}' + LOOP + "{% else %}{{ messages[1].content }}"
    (tmp_path / "some.jinja").write_text(short + "{% endif %}")
    records = [kto(None, "w4")] + [kto(None)] * 5  # the first renders, the rest run away
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = pack(tmp_path, demo_tokenizer, "c.jsonl", "--template", "some.jinja",
                  "--template-timeout", "0.2", "--max-seq-len", "64", "--max-reject-rate", "1",
                  "-o", "out")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert [code for _, code, _ in rejects(tmp_path / "out")] == ["template_error"] * 5
