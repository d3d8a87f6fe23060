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


def test_pack_on_two_workers_writes_the_same_shards(tmp_path, packed_demo_tokenizer):
    from tests.helpers import output_digests

    one, two = tmp_path / "one", tmp_path / "two"
    assert run(*pack_args(packed_demo_tokenizer, one)).exit_code == 0
    result = run(*pack_args(packed_demo_tokenizer, two, "--workers", "2", "--split-bytes", "4096"))
    assert result.exit_code == 0, result.output
    assert output_digests(one) == output_digests(two)
    manifest = json.loads((two / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["engine"] == {"name": "local", "workers": 2, "units": 4, "units_reused": 0}


def test_workers_auto_is_sized_by_the_input_and_changes_no_byte(
    tmp_path, packed_demo_tokenizer, monkeypatch
):
    from packshard.engine import base
    from tests.helpers import output_digests

    one, auto = tmp_path / "one", tmp_path / "auto"
    assert run(*pack_args(packed_demo_tokenizer, one, "--workers", "1")).exit_code == 0
    size = demo_data_path().stat().st_size
    monkeypatch.setattr(base, "AUTO_BYTES", size // 2)  # the demo file: two workers' worth
    result = run(*pack_args(packed_demo_tokenizer, auto, "--split-bytes", "4096"))
    assert result.exit_code == 0, result.output
    assert output_digests(one) == output_digests(auto)
    manifest = json.loads((auto / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["engine"]["workers"] == base.auto_workers(size)  # 2 here, with 2 cores


def test_workers_auto_keeps_one_process_below_its_size(monkeypatch):
    from packshard.engine import AUTO_BYTES, auto_workers, base

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))
    monkeypatch.setattr(base, "available_memory", lambda: 64 << 30)
    sizes = (0, AUTO_BYTES - 1, AUTO_BYTES, 3 * AUTO_BYTES)
    assert [auto_workers(n) for n in sizes] == [1, 1, 1, 3]
    assert auto_workers(100 * AUTO_BYTES) == 8  # at most one per core
    monkeypatch.setattr(base, "available_memory", lambda: 5 * base.WORKER_MEMORY // 2)
    assert auto_workers(100 * AUTO_BYTES) == 2  # and one per WORKER_MEMORY available
    monkeypatch.setattr(base, "available_memory", lambda: 0)
    assert auto_workers(100 * AUTO_BYTES) == 1
    monkeypatch.setattr(base, "available_memory", lambda: None)  # not Linux: cores and size
    assert auto_workers(100 * AUTO_BYTES) == 8


def test_available_memory_reads_this_machine():
    from packshard.engine.base import available_memory

    found = available_memory()
    if not os.path.exists("/proc/meminfo"):
        assert found is None
        return
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert found is not None and 0 < found <= physical


def test_workers_that_are_no_number_stop_in_one_line(tmp_path, packed_demo_tokenizer):
    result = run(*pack_args(packed_demo_tokenizer, tmp_path / "out", "--workers", "many"))
    assert result.exit_code == 2
    assert result.stderr == "error: --workers 'many' is neither a number nor 'auto'\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--ray-address", "10.0.0.1:6379"], "--ray-address needs --engine ray"),
        (["--workers", "0"], "--workers must be at least 1, got 0"),
        (
            ["--plan-scope", "group:0"],
            "--plan-scope 'group:0' is not global or group:N (N examples >= 1)",
        ),
    ],
)
def test_pack_refuses_bad_engine_options(tmp_path, packed_demo_tokenizer, extra, message):
    result = run(*pack_args(packed_demo_tokenizer, tmp_path / "out", *extra))
    assert result.exit_code == 2
    assert result.stderr == f"error: {message}\n"


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
    from packshard.ingest.read.sources import expand_inputs
    from packshard.profile import ProfileConfig, profile_inputs, report_to_dict

    path, page = tmp_path / "profile.json", tmp_path / "profile.html"
    args = ["profile", demo_data_path(), "-t", packed_demo_tokenizer, "--template", "chatml"]
    args += ["--max-seq-len", "256", "--no-progress", "--json", path, "--html", page]
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert f"wrote {path}\nwrote {page}\n" in result.stdout
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    assert text == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    files = expand_inputs([str(demo_data_path())])
    config = ProfileConfig((), str(packed_demo_tokenizer), 256, "chatml")
    report = profile_inputs(files, config)
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


def test_verify_names_drift_and_passes_when_nothing_changed(packed_demo_copy, tmp_path):
    from importlib.metadata import version

    manifest_path = packed_demo_copy / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["environment"]["libraries"]["tokenizers"] = "0.20.0"
    manifest_path.write_text(json.dumps(manifest))
    path = tmp_path / "audit.json"
    result = run("verify", packed_demo_copy, "--model", "none", "--json", path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    now = version("tokenizers")
    drift = [line for line in lines if line.startswith("drift:")]
    assert drift == [
        f"drift: tokenizers 0.20.0 when packed, {now} now",
        "drift: the source check re-made every example compared: none changed",
    ]
    ran = next(line for line in lines if line.startswith("ran with "))
    assert f"tokenizers {now}, jinja2 {version('jinja2')}," in ran
    assert f"torch {version('torch')}, transformers {version('transformers')};" in ran
    assert ran.endswith("template conventions hf-chat-template/1")
    assert lines[-2:] == ["OK: every seam holds", f"wrote {path}"]
    report = json.loads(path.read_text())
    assert report["drift"] == [{"name": "tokenizers", "recorded": "0.20.0", "running": now}]
    assert report["environment"]["libraries"]["transformers"] == version("transformers")
    assert report["environment"]["tolerance"] == {"atol": 1e-4, "control_floor": 1e-3}


def test_verify_says_when_nothing_drifted_or_nothing_was_recorded(packed_demo_copy):
    result = run("verify", packed_demo_copy, "--model", "none")
    ran = [line for line in result.stdout.splitlines() if line.startswith("ran with ")]
    assert len(ran) == 1 and ran[0].endswith(" (as when packed)")
    assert "drift:" not in result.stdout
    manifest_path = packed_demo_copy / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["environment"]  # as an older packshard wrote it
    manifest_path.write_text(json.dumps(manifest))
    result = run("verify", packed_demo_copy, "--model", "none", "--no-source")
    assert result.exit_code == 0, result.output
    assert (
        "note: the manifest records no environment (packed before packshard recorded one): "
        "drift cannot be named\n"
    ) in result.stdout


def test_verify_says_drift_is_unchecked_without_the_source_check(packed_demo_copy):
    manifest_path = packed_demo_copy / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["environment"]["libraries"]["jinja2"] = "3.1.0"
    manifest_path.write_text(json.dumps(manifest))
    result = run("verify", packed_demo_copy, "--model", "none", "--no-source")
    assert result.exit_code == 0, result.output
    assert (
        "drift: the source check did not run, so whether these versions change the pack is "
        "unknown (re-verify with the inputs)\n"
    ) in result.stdout


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


# --- export -----------------------------------------------------------------------------------


def test_export_writes_the_target_and_names_every_file(packed_demo, tmp_path):
    result = run("export", packed_demo, "--to", "megatron", "-o", tmp_path / "mb")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"exported {packed_demo} → {tmp_path / 'mb'} (megatron): rows 15, ")
    assert [line.split()[0] for line in lines[1:]] == [
        "256_metadata.jsonl",
        "training_256.idx.parquet",
        "export.json",
    ]
    again = run("export", packed_demo, "--to", "megatron", "-o", tmp_path / "mb")
    assert again.exit_code == 2
    assert again.stderr == (
        f"error: {tmp_path / 'mb'}: output folder exists and is not empty (use --overwrite)\n"
    )
    wrong = run("export", packed_demo, "--to", "nemo", "-o", tmp_path / "x")
    assert wrong.exit_code == 2
    assert "Invalid value for '--to': 'nemo' is not one of 'megatron', 'megatron-npy', " in (
        wrong.stderr
    )
    missing = run("export", tmp_path / "nothing", "--to", "mds", "-o", tmp_path / "y")
    assert missing.exit_code == 2 and missing.stderr.startswith("error: ")


# --- reasoning and turn options ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--reasoning-markers", "<think>"],
            "Invalid value for '--reasoning-markers': expected OPEN,CLOSE "
            "(e.g. '<think>,</think>'), got '<think>'",
        ),
        (["--reasoning", "keep"], "Invalid value for '--reasoning': 'keep' is not one of"),
        (["--turns", "each"], "Invalid value for '--turns': 'each' is not one of"),
    ],
)
def test_bad_reasoning_options_are_usage_errors(tmp_path, packed_demo_tokenizer, extra, message):
    result = run(*pack_args(packed_demo_tokenizer, tmp_path / "out", *extra))
    assert result.exit_code == 2 and message in result.stderr


def test_expand_and_wrapped_do_not_combine(tmp_path, packed_demo_tokenizer):
    extra = ("--turns", "expand", "--strategy", "wrapped")
    result = run(*pack_args(packed_demo_tokenizer, tmp_path / "out", *extra))
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --turns expand builds one example per turn; --strategy wrapped would cut them "
        "into a stream (use --strategy bfd|ffd)\n"
    )


def test_pack_says_how_many_turns_lost_their_reasoning(tmp_path):
    from tests.helpers import THINK, answer, build_qwen, chat, user, write_jsonl

    template = tmp_path / "think.jinja"
    template.write_text(THINK, encoding="utf-8")
    record = chat(
        user("2+2?"), answer("4", reasoning="Add."), user("3+3?"), answer("6", reasoning="Add.")
    )
    data = write_jsonl(tmp_path / "r.jsonl", [record])
    qwen = build_qwen(tmp_path / "qwen")
    common = ["-t", qwen, "--template", template, "--max-seq-len", "128", "--no-progress"]
    result = run("pack", data, *common, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert (
        "reasoning: 1 trained turn rendered without the reasoning their template leaves out "
        "of history (--turns expand trains each turn with it)"
    ) in " ".join(result.stdout.split())
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["stats"]["reasoning_dropped"] == 1
    assert manifest["template"]["reasoning_field"] == "reasoning_content"
    result = run("pack", data, *common, "-o", tmp_path / "expanded", "--turns", "expand")
    assert result.exit_code == 0 and "reasoning:" not in result.stdout
    result = run("profile", data, *common, "--reasoning", "mask")
    assert result.exit_code == 0 and "Reasoning" in result.stdout
