"""The command line: exact error texts and exit codes (0 ok, 1 findings, 2 usage)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.demo import demo_data_path


def run(*args: str | Path) -> object:
    return CliRunner().invoke(
        main, [str(a) for a in args], prog_name="packshard", catch_exceptions=False
    )


def pack_args(tokenizer: Path, out: Path, *extra: str) -> list[str | Path]:
    return [
        "pack",
        demo_data_path(),
        "-t",
        tokenizer,
        "--template",
        "chatml",
        "--max-seq-len",
        "256",
        "-o",
        out,
        "--no-progress",
        *extra,
    ]


# --- pack -----------------------------------------------------------------------------------


def test_pack_then_verify_exit_zero(tmp_path, packed_demo_tokenizer):
    out = tmp_path / "out"
    result = run(*pack_args(packed_demo_tokenizer, out))
    assert result.exit_code == 0, result.output
    assert "counts add up: 65 = 64 packed + 1 rejected + 0 dropped" in result.stdout
    assert "rejects by code: invalid_json 1" in result.stdout
    result = run("verify", out, "--model", "none")
    assert result.exit_code == 0, result.output
    assert "OK: every seam holds" in result.stdout
    assert "64 examples re-tokenized and compared" in result.stdout


def test_pack_missing_tokenizer(tmp_path):
    result = run(*pack_args(tmp_path / "nope", tmp_path / "out"))
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {tmp_path}/nope: no such file (pass a tokenizer.json or its folder with "
        "--tokenizer)\n"
    )
    assert not (tmp_path / "out").exists()


def test_pack_missing_input(tmp_path, packed_demo_tokenizer):
    args = pack_args(packed_demo_tokenizer, tmp_path / "out")
    args[1] = tmp_path / "missing.jsonl"
    result = run(*args)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {tmp_path}/missing.jsonl")
    assert result.stderr.count("\n") == 1


def test_pack_refuses_a_non_empty_out_without_overwrite(tmp_path, packed_demo_tokenizer):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    refused = (
        f"error: {out}: output folder holds 'keep.txt' but no packshard manifest; --overwrite "
        "only replaces a folder packshard wrote (choose another -o, or empty it)\n"
    )
    for extra in ((), ("--overwrite",)):  # a folder packshard did not write is never replaced
        result = run(*pack_args(packed_demo_tokenizer, out, *extra))
        assert (result.exit_code, result.stderr) == (2, refused)
        assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    assert run(*pack_args(packed_demo_tokenizer, out)).exit_code == 0
    result = run(*pack_args(packed_demo_tokenizer, out))
    assert result.exit_code == 2
    assert (
        result.stderr == f"error: {out}: output folder exists and is not empty (use --overwrite)\n"
    )
    result = run(*pack_args(packed_demo_tokenizer, out, "--overwrite"))
    assert result.exit_code == 0, result.output
    assert (out / "manifest.json").is_file()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1", "error: --max-seq-len 1 is too small (need at least 2)\n"),
        ("0", "error: --max-seq-len 0 is too small (need at least 2)\n"),
        (
            "abc",
            "Usage: packshard pack [OPTIONS] DATA...\nTry 'packshard pack --help' for help.\n\n"
            "Error: Invalid value for '--max-seq-len': 'abc' is not a valid integer.\n",
        ),
    ],
)
def test_pack_bad_max_seq_len(tmp_path, packed_demo_tokenizer, value, message):
    args = pack_args(packed_demo_tokenizer, tmp_path / "out")
    args[args.index("256")] = value
    result = run(*args)
    assert result.exit_code == 2
    assert result.stderr == message


def test_pack_without_a_template_says_which_flag_fixes_it(tmp_path, packed_demo_tokenizer):
    args = pack_args(packed_demo_tokenizer, tmp_path / "out")
    del args[4:6]  # --template chatml
    result = run(*args)
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {packed_demo_tokenizer}: the tokenizer has no chat template "
        "(use --template chatml or --template FILE.jinja)\n"
    )


def test_long_error_lines_are_not_wrapped(tmp_path):
    deep = tmp_path / ("x" * 120)
    deep.mkdir()
    result = run("verify", deep)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1


# --- profile --------------------------------------------------------------------------------


def test_profile_json_is_the_report_sorted(tmp_path, packed_demo_tokenizer):
    from packshard.ingest.sources import expand_inputs
    from packshard.ingest.templates import load_template
    from packshard.ingest.tokenizer import load_tokenizer
    from packshard.profile import profile_inputs, report_to_dict
    from packshard.records import IngestOptions

    path, page = tmp_path / "profile.json", tmp_path / "profile.html"
    args = ["profile", demo_data_path(), "-t", packed_demo_tokenizer, "--template", "chatml"]
    args += ["--max-seq-len", "256", "--no-progress", "--json", path, "--html", page]
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert f"wrote {path}\nwrote {page}\n" in result.stdout
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    assert text == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    bundle = load_tokenizer(str(packed_demo_tokenizer))
    report = profile_inputs(
        expand_inputs([str(demo_data_path())]),
        bundle,
        load_template("chatml", bundle),
        IngestOptions(),
        256,
    )
    assert data == json.loads(json.dumps(report_to_dict(report)))
    assert data["total"]["records"] == 65 and data["total"]["rejected"] == 1
    assert page.read_text(encoding="utf-8").count('class="hist"') == len(data["domains"]) + (
        len(data["domains"]) > 1
    )


# --- verify ---------------------------------------------------------------------------------


def test_verify_on_a_file(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("{}\n")
    result = run("verify", path)
    assert result.exit_code == 2
    assert result.stderr == f"error: {path}: not a folder (give the OUT folder that pack wrote)\n"


def test_verify_on_a_missing_path(tmp_path):
    result = run("verify", tmp_path / "nothing")
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {tmp_path}/nothing: not a folder (give the OUT folder that pack wrote)\n"
    )


def test_verify_on_a_folder_without_manifest(tmp_path):
    result = run("verify", tmp_path)
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {tmp_path}/manifest.json: no manifest (is {tmp_path} a packshard output "
        "folder? a run that was interrupted leaves none: pack again)\n"
    )


def test_verify_unsupported_format_version(packed_demo_copy):
    path = packed_demo_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["format_version"] = 7
    path.write_text(json.dumps(manifest))
    result = run("verify", packed_demo_copy, "--model", "none")
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {path}: format_version 7 is not supported by this packshard (supports 1); "
        "upgrade packshard or re-pack the data\n"
    )


def test_verify_findings_exit_one_and_are_listed(packed_demo_copy):
    os.remove(packed_demo_copy / "shard-00003.parquet")
    result = run("verify", packed_demo_copy, "--model", "none")
    assert result.exit_code == 1
    assert "✗ [integrity] shard-00003.parquet: listed in the manifest but missing" in (
        result.stdout
    )
    assert result.stdout.endswith("FAILED: 1 finding\n")
    assert "│ integrity │ failed  │ 1 finding " in result.stdout


def test_verify_json_has_the_seam_table(packed_demo, tmp_path):
    path = tmp_path / "audit.json"
    result = run("verify", packed_demo, "--model", "none", "--json", path)
    assert result.exit_code == 0, result.output
    assert f"wrote {path}" in result.stdout
    report = json.loads(path.read_text())
    assert report["ok"] is True and report["findings"] == []
    assert report["checks"]["model"] == {"status": "skipped", "detail": "--model none"}
    table = report["seam_table"]
    assert len(table) == 15
    for entry in table:
        assert set(entry) == {
            "shard",
            "row",
            "segments",
            "seams_checked",
            "max_logit_delta",
            "findings",
        }
        assert entry["seams_checked"] == entry["segments"] - 1
        assert entry["findings"] == 0
    assert [(e["shard"], e["row"]) for e in table[:5]] == [
        ("shard-00000.parquet", 0),
        ("shard-00000.parquet", 1),
        ("shard-00000.parquet", 2),
        ("shard-00000.parquet", 3),
        ("shard-00001.parquet", 0),
    ]
    assert sum(e["segments"] for e in table) == 64


def test_verify_no_source_skips_the_source_check(packed_demo):
    result = run("verify", packed_demo, "--model", "none", "--no-source")
    assert result.exit_code == 0
    assert "source    │ skipped │ --no-source" in result.stdout


def test_verify_required_source_that_is_missing_fails(packed_demo_copy, tmp_path):
    manifest_path = packed_demo_copy / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["inputs"][0]["path"] = manifest["inputs"][0]["resolved"] = str(tmp_path / "gone.jsonl")
    manifest_path.write_text(json.dumps(manifest))
    result = run("verify", packed_demo_copy, "--model", "none")
    assert result.exit_code == 2, result.output  # not found: not run (only --no-source skips)
    assert f"not run: source: input {tmp_path}/gone.jsonl not found" in result.stdout
    result = run("verify", packed_demo_copy, "--model", "none", "--source")
    assert result.exit_code == 1
    assert f"input {tmp_path}/gone.jsonl not found (give --source-root)" in result.stdout


# --- inspect --------------------------------------------------------------------------------


def test_inspect_row_out_of_range(packed_demo):
    result = run("inspect", packed_demo, "--row", "99")
    assert result.exit_code == 2
    assert result.stderr == "error: --row 99 out of range (shard-00000.parquet has 4 rows)\n"


def test_inspect_shard_out_of_range(packed_demo):
    result = run("inspect", packed_demo, "--shard", "4")
    assert result.exit_code == 2
    assert result.stderr == "error: --shard 4 out of range (the folder has 4 shards)\n"


def test_inspect_on_a_folder_without_manifest(tmp_path):
    result = run("inspect", tmp_path)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {tmp_path}/manifest.json: no manifest")


@pytest.mark.torch
def test_verify_json_with_the_model_fills_logit_deltas(packed_demo, tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "audit.json"
    result = run("verify", packed_demo, "--no-source", "--model-rows", "2", "--json", path)
    assert result.exit_code == 0, result.output
    assert "control: a naive causal mask over the same rows leaks" in result.stdout
    report = json.loads(path.read_text())
    checked = [e for e in report["seam_table"] if e["max_logit_delta"] is not None]
    assert len(checked) == 2
    assert all(e["segments"] >= 2 and e["max_logit_delta"] < 1e-4 for e in checked)
    assert all(e["control_delta"] > 1e-2 for e in checked)
    model = report["model"]
    assert model["control_detected"] is True and len(model["rows"]) == 2
    assert report["checks"]["model"]["status"] == "passed"
