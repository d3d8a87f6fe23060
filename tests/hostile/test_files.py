"""Hostile input files: nothing is dropped silently, nothing hangs, nothing exhausts memory.

Each case packs in a private folder and checks the exact exit code and message, the rejects
(with their counts adding up), and that nothing but OUT appeared or changed.  Resource cases
(decompression bombs, FIFOs) run in a fresh process under a memory cap and a timeout.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from click.testing import CliRunner

from packshard.cli.commands import main
from tests.helpers import changed, reject_lines, run_capped, tree_state

GOOD = {"text": "w2 w3 w4"}
DUP_ROLE = (
    '{"messages": [{"role": "user", "role": "assistant", "content": "hi"}, '
    '{"role": "assistant", "content": "w2"}]}'
)
TOO_LARGE = (
    "is larger than {n:,} bytes (use --max-record-bytes to raise the limit for records this large)"
)


def pack(root: Path, tokenizer: Path, *args: Any, out: str = "out") -> Any:
    """Run ``packshard pack ARGS -o root/out`` in-process, from ``root``."""
    argv = ["pack", "-t", str(tokenizer), "--max-seq-len", "16", "-o", str(root / out)]
    argv += ["--no-progress", *map(str, args)]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return CliRunner().invoke(main, argv, prog_name="packshard", catch_exceptions=False)
    finally:
        os.chdir(cwd)


rejects = reject_lines


def counts(out: Path) -> tuple[int, int, int]:
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    assert stats["records"] == stats["records_packed"] + stats["rejected"] + stats["dropped"]
    return stats["records"], stats["records_packed"], stats["rejected"]


def only_out_changed(before: dict[str, Any], root: Path, out: str = "out") -> None:
    assert all(p == out or p.startswith(f"{out}/") for p in changed(before, tree_state(root)))


# --- JSON arrays: an unusable element is a counted reject, the next one is still read ---------


def test_elements_past_a_bad_one_are_read(tmp_path, word_tokenizer):
    good = json.dumps(GOOD)
    elements = [
        good,
        '{"text": ' + "[" * 50_000 + "]" * 50_000 + "}",  # valid JSON, too deep for the parser
        good,
        '{"text": "w2", "text": "w3"}',
        "1" * 5000,  # more digits than Python converts
        '{"text": "' + "w2 " * 200 + '"}',  # over --max-record-bytes 300
        good,
    ]
    (tmp_path / "arr.json").write_text("[\n" + ",\n".join(elements) + "\n]")
    before = tree_state(tmp_path)
    result = pack(tmp_path, word_tokenizer, "arr.json", "--max-record-bytes", "300",
                  "--max-reject-rate", "1")  # fmt: skip
    assert result.exit_code == 0, result.output
    duplicate = "duplicate key 'text' in a JSON object (json would silently keep the last value"
    digits = "invalid JSON: a number with more than 4300 digits (Python does not convert it)"
    assert rejects(tmp_path / "out") == [
        (2, "invalid_json", "invalid JSON: nested too deeply"),
        (4, "duplicate_key", duplicate + "; fix the record)"),
        (5, "invalid_json", digits),
        (6, "too_large", "element " + TOO_LARGE.format(n=300)),
    ]
    assert counts(tmp_path / "out") == (7, 3, 4)
    only_out_changed(before, tmp_path)


def test_a_syntax_error_still_stops_the_array_and_says_so(tmp_path, word_tokenizer):
    (tmp_path / "arr.json").write_text(f'[{json.dumps(GOOD)}, {{"text": }}, {json.dumps(GOOD)}]')
    result = pack(tmp_path, word_tokenizer, "arr.json")
    assert result.exit_code == 0, result.output
    [(line, code, reason)] = rejects(tmp_path / "out")
    assert (line, code) == (2, "invalid_json")
    assert reason.endswith("; the rest of the file is not read")


# --- JSONL: lines over the limit are rejected before parsing, never held ----------------------


def test_an_oversized_line_is_rejected_and_the_next_one_read(tmp_path, word_tokenizer):
    huge = '{"text": "' + "w2 " * 800_000 + '"}'  # 2.4 MB: crosses 1 MiB read chunks
    lines = [json.dumps(GOOD), huge, "", json.dumps(GOOD), huge]
    (tmp_path / "d.jsonl").write_text("\n".join(lines))  # the last line has no newline
    result = pack(tmp_path, word_tokenizer, "d.jsonl", "--max-record-bytes", "100000")
    assert result.exit_code == 0, result.output
    assert rejects(tmp_path / "out") == [
        (2, "too_large", "line " + TOO_LARGE.format(n=100000)),
        (5, "too_large", "line " + TOO_LARGE.format(n=100000)),
    ]
    assert counts(tmp_path / "out") == (4, 2, 2)


def test_duplicate_keys_are_rejected_with_their_own_code(tmp_path, word_tokenizer):
    nested = '{"text": "w2", "meta": {"a": 1, "a": 2}}'
    (tmp_path / "d.jsonl").write_text(f"{DUP_ROLE}\n{nested}\n{json.dumps(GOOD)}\n")
    result = pack(tmp_path, word_tokenizer, "d.jsonl", "--template", "chatml",
                  "--max-reject-rate", "1")  # fmt: skip
    assert result.exit_code == 0, result.output
    why = "in a JSON object (json would silently keep the last value; fix the record)"
    assert rejects(tmp_path / "out") == [
        (1, "duplicate_key", f"duplicate key 'role' {why}"),
        (2, "duplicate_key", f"duplicate key 'a' {why}"),
    ]
    assert "rejects by code: duplicate_key 2" in result.stdout


def test_parquet_rows_with_repeated_fields_or_over_the_limit(tmp_path, word_tokenizer):
    turn = pa.struct([("role", pa.string()), ("role", pa.string()), ("content", pa.string())])
    dup = pa.table({"messages": pa.array([[("user", "assistant", "hi")]], pa.list_(turn))})
    pq.write_table(dup, tmp_path / "dup.parquet")
    texts = ["w2 w3", "w4 " * 5000, "w5 w6"]
    pq.write_table(pa.table({"text": texts}), tmp_path / "big.parquet")
    args = ("dup.parquet", "big.parquet", "--max-record-bytes", "1000")
    result = pack(tmp_path, word_tokenizer, *args)
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()
    repeated = "duplicate field 'role' in the Parquet schema (fix the file)"
    assert [(r["source"], r["line"], r["code"], r["reason"]) for r in map(json.loads, lines)] == [
        ("dup.parquet", 1, "duplicate_key", repeated),
        ("big.parquet", 2, "too_large", "row " + TOO_LARGE.format(n=1000)),
    ]
    assert counts(tmp_path / "out") == (4, 2, 2)


# --- folders and globs: nothing skipped without a word, nothing that blocks -------------------


def test_an_unreadable_subfolder_is_a_usage_error(tmp_path, word_tokenizer, monkeypatch):
    import packshard.ingest.read.inputs as inputs

    (tmp_path / "data" / "locked").mkdir(parents=True)
    (tmp_path / "data" / "a.jsonl").write_text(json.dumps(GOOD) + "\n")
    (tmp_path / "data" / "locked" / "b.jsonl").write_text(json.dumps(GOOD) + "\n")
    real = os.scandir

    def scandir(path: Any) -> Any:
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(inputs.os, "scandir", scandir)
    before = tree_state(tmp_path)
    for spec in ("data", "data/**/*.jsonl", "data/*/*.jsonl"):
        result = pack(tmp_path, word_tokenizer, spec)
        assert (result.exit_code, result.stderr) == (
            2,
            "error: data/locked: cannot list folder (Permission denied); its files would be "
            "left out (fix its permissions or leave it out of the inputs)\n",
        ), spec
    assert changed(before, tree_state(tmp_path)) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any folder")
def test_a_folder_without_read_permission_is_a_usage_error(tmp_path, word_tokenizer):
    (tmp_path / "data" / "locked").mkdir(parents=True)
    (tmp_path / "data" / "a.jsonl").write_text(json.dumps(GOOD) + "\n")
    (tmp_path / "data" / "locked").chmod(0)
    try:
        result = pack(tmp_path, word_tokenizer, "data")
    finally:
        (tmp_path / "data" / "locked").chmod(0o755)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: data/locked: cannot list folder (Permission denied)")


def test_fifos_broken_links_and_link_loops(tmp_path, word_tokenizer):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.jsonl").write_text(json.dumps(GOOD) + "\n")
    (data / "sub" / "back").symlink_to(data)  # a loop: each file is still read once
    result = pack(tmp_path, word_tokenizer, "data")
    assert result.exit_code == 0, result.output
    assert counts(tmp_path / "out") == (1, 1, 0)
    os.mkfifo(data / "pipe.jsonl")
    fifo = (
        "error: {}: a FIFO, not a regular file (reading it could block forever; remove it from "
        "the inputs)\n"
    )
    for spec, named in (("data", "data/pipe.jsonl"), ("data/*.jsonl", "data/pipe.jsonl")):
        result = pack(tmp_path, word_tokenizer, spec, out="out2")
        assert (result.exit_code, result.stderr) == (2, fifo.format(named)), spec
    (data / "pipe.jsonl").unlink()
    (data / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    result = pack(tmp_path, word_tokenizer, "data", out="out2")
    assert (result.exit_code, result.stderr) == (
        2,
        "error: data/gone.jsonl: broken link or unreadable entry (fix it or leave it out of the "
        "inputs)\n",
    )
    assert not (tmp_path / "out2").exists()


def test_a_fifo_named_directly_does_not_block(tmp_path, word_tokenizer):
    os.mkfifo(tmp_path / "pipe.jsonl")
    args = ["pack", "pipe.jsonl", "-t", word_tokenizer, "--max-seq-len", "16", "-o", "out"]
    done = run_capped(args, tmp_path, seconds=60)  # a blocking open would time out here
    assert (done.returncode, done.stderr) == (
        2,
        "error: pipe.jsonl: a FIFO, not a regular file (reading it could block forever; remove "
        "it from the inputs)\n",
    )


# --- decompression: bounded memory, bombs stop the run ----------------------------------------


def _bombs(root: Path) -> None:
    line = json.dumps(GOOD).encode() + b"\n"
    with gzip.open(root / "bomb.jsonl.gz", "wb", compresslevel=9) as fh:
        fh.write(line)
        for _ in range(64):  # 64 MiB of zeros in 64 KB: a ratio of 1,000
            fh.write(b"\0" * (1 << 20))
    with (
        open(root / "bomb.jsonl.zst", "wb") as raw,
        zstandard.ZstdCompressor(level=1).stream_writer(raw) as fh,
    ):
        fh.write(line)
        for _ in range(2048):  # a 2 GiB line in 64 KB: more than the capped run may hold
            fh.write(b"x" * (1 << 20))
        fh.write(b"\n" + line)


def test_decompression_bombs_fail_fast_in_bounded_memory(tmp_path, word_tokenizer):
    _bombs(tmp_path)
    base = ["-t", word_tokenizer, "--max-seq-len", "16", "--no-progress"]
    for name, codec in (("bomb.jsonl.gz", "gz"), ("bomb.jsonl.zst", "zst")):
        done = run_capped(["pack", name, *base, "-o", "out"], tmp_path, seconds=120)
        assert done.returncode == 1, done.stderr  # bad data, not a bad option
        size = f"{(tmp_path / name).stat().st_size:,}"
        assert done.stderr.startswith(f"error: {name}: expands more than 200x ({size} .{codec}")
        assert done.stderr.endswith("a decompression bomb? (use --max-expansion to allow more)\n")
        assert done.stderr.count("\n") == 1
        assert not (tmp_path / "out").exists()
    # allowed to expand, the 4 GiB line is rejected without being held; the run goes on
    args = ["pack", "bomb.jsonl.zst", *base, "--max-expansion", "1000000", "-o", "out"]
    done = run_capped(args, tmp_path, seconds=300)
    assert done.returncode == 0, done.stderr
    assert rejects(tmp_path / "out") == [(2, "too_large", "line " + TOO_LARGE.format(n=16 << 20))]
    assert counts(tmp_path / "out") == (3, 2, 1)


def test_decompressed_bytes_have_a_limit(tmp_path, word_tokenizer):
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as fh:
        fh.write((json.dumps(GOOD) + "\n") * 100)
    result = pack(tmp_path, word_tokenizer, "d.jsonl.gz", "--max-decompressed-bytes", "1000")
    assert (result.exit_code, result.stderr) == (
        1,
        "error: d.jsonl.gz: decompresses to more than 1,000 bytes (use --max-decompressed-bytes "
        "to raise the limit for a file this large)\n",
    )
    assert not (tmp_path / "out").exists()


# --- nothing packed, options out of range ------------------------------------------------------


def test_zero_packed_records_is_an_error_and_leaves_no_out(tmp_path, word_tokenizer):
    (tmp_path / "d.jsonl").write_text('{"x": 1}\n[1]\n')
    before = tree_state(tmp_path)
    result = pack(tmp_path, word_tokenizer, "d.jsonl")
    assert (result.exit_code, result.stderr) == (
        1,
        "error: nothing to pack: none of the 2 records read was packed (not_an_object 1, "
        "unknown_format 1); no output was written (fix the inputs or the options, e.g. "
        f"--max-seq-len, --overlong); its rejects are in {tmp_path}/.out.rejects.jsonl\n",
    )
    assert changed(before, tree_state(tmp_path)) == [".out.rejects.jsonl"]  # no OUT


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--max-seq-len", str(10**12), f"--max-seq-len must be at most 16,777,216, got {10**12}"),
        ("--seed", "-1", "--seed must be at least 0, got -1"),
        ("--shard-rows", str(10**11), f"--shard-rows must be at most 2,147,483,647, got {10**11}"),
        ("--num-workers", "0", "--num-workers must be at least 1, got 0"),
        ("--max-record-bytes", "0", "--max-record-bytes must be at least 1, got 0"),
        ("--max-expansion", "0", "--max-expansion must be at least 1, got 0"),
        ("--template-timeout", "0", "--template-timeout must be at least 0.001, got 0.0"),
        ("--template-timeout", "nan", "--template-timeout must be a number, got nan"),
    ],
)
def test_options_are_checked_before_any_work(tmp_path, word_tokenizer, option, value, message):
    before = tree_state(tmp_path)
    result = pack(tmp_path, word_tokenizer, "not-read-yet.jsonl", option, value)
    assert (result.exit_code, result.stderr) == (2, f"error: {message}\n")
    assert changed(before, tree_state(tmp_path)) == []


def test_profile_options_are_checked_before_any_work(tmp_path, word_tokenizer):
    argv = ["profile", "missing.jsonl", "-t", str(word_tokenizer), "--max-seq-len", "16"]
    for extra, message in (
        (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["--seed", "-3"], "--seed must be at least 0, got -3"),
        (["--max-seq-len", str(10**12)], "--max-seq-len must be at most 16,777,216, got 10"),
    ):
        result = CliRunner().invoke(main, argv + extra, catch_exceptions=False)
        assert result.exit_code == 2
        assert result.stderr.startswith(f"error: {message}")
