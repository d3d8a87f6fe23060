"""Error surfaces: whatever goes wrong ends with one compiler-style line, exit 1 or 2.

Disk full (a real ``/dev/full`` and a file-size cap), a damaged or hostile manifest, a corrupt
rejects file, crafted shard rows, options out of range: each is one line on stderr naming the
place and the fix, never a traceback, and ``verify`` reports a damaged file as a finding.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.digests import sha256_path
from tests.helpers import changed, run_capped, tree_state

FULL = Path("/dev/full")


def cli(*args: Any) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def one_line(result: Any, code: int, message: str) -> None:
    assert (result.exit_code, result.stderr) == (code, f"error: {message}\n")


def rewrite(out: Path, edit: Any, name: str = "shard-00000.parquet") -> None:
    """Rewrite a shard's rows with ``edit`` and keep the manifest's checksums right."""
    path = out / name
    table = pq.read_table(path)
    rows = table.to_pylist()
    edit(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path, use_dictionary=False)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][0].update(sha256=sha256_path(path), bytes=path.stat().st_size)
    (out / "manifest.json").write_text(json.dumps(manifest))


# --- the environment refuses: disk full, a file-size cap ---------------------------------------


@pytest.mark.skipif(not FULL.exists(), reason="no /dev/full on this system")
def test_a_full_disk_is_one_line(packed_demo, tmp_path, word_tokenizer):
    (tmp_path / "d.jsonl").write_text('{"text": "w2 w3"}\n')
    full = "/dev/full: No space left on device (the disk is full: free space or write elsewhere)"
    args = ["d.jsonl", "-t", word_tokenizer, "--max-seq-len", "8", "--json", FULL]
    args += ["--backend", "reference"]  # no note on the encoder: the error is the one line
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        one_line(cli("profile", *args), 2, full)
    finally:
        os.chdir(cwd)
    one_line(cli("inspect", packed_demo, "--html", FULL), 2, full)
    one_line(cli("verify", packed_demo, "--model", "none", "--no-source", "--json", FULL), 2, full)


def test_a_write_past_the_file_size_limit_leaves_nothing(tmp_path, word_tokenizer):
    lines = [
        json.dumps({"text": " ".join(f"w{(i * k) % 400 + 2}" for k in range(7))})
        for i in range(3000)
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    before = tree_state(tmp_path)
    args = ["pack", "d.jsonl", "-t", word_tokenizer, "--max-seq-len", "64", "-o", "out"]
    args += ["--backend", "reference"]  # stderr holds only the error
    done = run_capped(args, tmp_path, file_size=40_000, seconds=120)  # the data itself fits
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: out: ")
    assert done.stderr.endswith("File too large (the file is larger than this system allows)\n")
    assert done.stderr.count("\n") == 1
    assert changed(before, tree_state(tmp_path)) == []  # no OUT, no partial, no lock


# --- damaged folders: findings for verify, one line for inspect -------------------------------


@pytest.mark.parametrize(
    ("damage", "finding"),
    [
        (b'{"code": "invalid_json"\n', "rejects.jsonl:2: not a JSON line"),
        (b"\xff\xfe\n", "rejects.jsonl: not UTF-8 (invalid start byte)"),
        (
            b'{"a": "' + b"x" * (2 << 20) + b'"}\n',
            "rejects.jsonl:2: line longer than 1,048,576 characters",
        ),
        (
            b'{"code": "made_up", "domain": "d", "line": 1, "reason": "r", "source": "s"}\n',
            "rejects.jsonl:2: unknown reject code 'made_up'",
        ),
    ],
    ids=["not-json", "not-utf8", "huge-line", "unknown-code"],
)
def test_a_corrupt_rejects_file_is_a_finding(packed_demo_copy, damage, finding):
    path = packed_demo_copy / "rejects.jsonl"
    path.write_bytes(path.read_bytes() + damage)
    result = cli("verify", packed_demo_copy, "--model", "none")
    assert result.exit_code == 1
    assert f"✗ [integrity] {packed_demo_copy}/{finding}" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda rows: rows[1].update(cu_seqlens=[]), "cu_seqlens or example_ids break the row"),
        (
            lambda rows: rows[1].update(labels=rows[1]["labels"][:-1]),
            "input_ids and labels differ in length",
        ),
        (
            lambda rows: rows[1].update(cu_seqlens=[0, 5, 3, len(rows[1]["input_ids"])]),
            "cu_seqlens or example_ids break the row",
        ),
        (
            lambda rows: rows[1].update(example_ids=rows[1]["example_ids"][:-1]),
            "cu_seqlens or example_ids break the row",
        ),
    ],
    ids=["empty-cu", "short-labels", "cu-decreasing", "ids-short"],
)
def test_crafted_rows_given_to_inspect_are_one_line(packed_demo_copy, edit, problem):
    rewrite(packed_demo_copy, edit)
    one_line(
        cli("inspect", packed_demo_copy, "--row", "1"),
        1,
        f"{packed_demo_copy}/shard-00000.parquet: row 1: {problem} (run packshard verify)",
    )
    result = cli("verify", packed_demo_copy, "--model", "none", "--no-source")
    assert result.exit_code == 1
    assert "✗ [structure] shard-00000.parquet row 1" in result.stdout


def test_a_damaged_manifest_is_one_line_everywhere(packed_demo_copy):
    out = packed_demo_copy
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"] = ["examples.parquet"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    one_line(
        cli("inspect", out),
        2,
        "manifest.json: files: ['examples.parquet'] is not of type 'object'",
    )
    result = cli("verify", out, "--model", "none")
    assert result.exit_code == 1
    assert "✗ [integrity] manifest.json: files: ['examples.parquet'] is not of type" in (
        result.stdout
    )
    (out / "manifest.json").write_text("[" * 50_000)
    for command in ("verify", "inspect"):
        one_line(
            cli(command, out), 2, f"{out}/manifest.json: unreadable manifest: nested too deeply"
        )


def test_reports_are_never_written_over_what_is_read(packed_demo, tmp_path, word_tokenizer):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "w2 w3"}\n')
    before = tree_state(tmp_path)
    args = ["profile", data, "-t", word_tokenizer, "--max-seq-len", "8"]
    one_line(
        cli(*args, "--json", data),
        2,
        f"{data}: would write over or into {data}, which is being read",
    )
    assert changed(before, tree_state(tmp_path)) == []
    manifest = packed_demo / "manifest.json"
    for command in (["verify", packed_demo, "--json"], ["inspect", packed_demo, "--html"]):
        one_line(
            cli(*command, manifest),
            2,
            f"{manifest}: would write over or into {packed_demo}, which is being read",
        )


def test_a_path_holding_a_newline_still_gives_one_line(tmp_path, word_tokenizer):
    bad = tmp_path / "two\nlines.jsonl"
    one_line(
        cli("pack", bad, "-t", word_tokenizer, "--max-seq-len", "8", "-o", tmp_path / "out"),
        2,
        f"{tmp_path}/two\\nlines.jsonl: no such file or folder",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sample", "-1"], "--sample must be at least 1, got -1"),
        (["--sample", "0"], "--sample must be at least 1, got 0"),
        (["--model-rows", "0"], "--model-rows must be at least 1, got 0"),
        (["--seed", "-1"], "--seed must be at least 0, got -1"),
    ],
)
def test_verify_options_out_of_range_are_usage_errors(packed_demo, args, message):
    one_line(cli("verify", packed_demo, "--model", "none", *args), 2, message)
