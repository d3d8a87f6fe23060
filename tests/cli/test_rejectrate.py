"""The reject rate: exit 1 over --max-reject-rate (0.5 by default), a warning over 10%."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.cli.rejectrate import likely_cause, reject_rate_line
from packshard.demo import demo_data_path


def run(*args: object) -> object:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def pack_args(tokenizer: Path, out: Path, *extra: str) -> list[object]:
    return ["pack", demo_data_path(), "-t", tokenizer, "--template", "chatml",
            "--max-seq-len", "256", "-o", out, "--no-progress", *extra]  # fmt: skip


def test_forced_format_over_the_limit_exits_one_naming_the_cause(tmp_path, packed_demo_tokenizer):
    out = tmp_path / "out"
    result = run(*pack_args(packed_demo_tokenizer, out, "--format", "alpaca",
                            "--max-reject-rate", "0.2"))  # fmt: skip
    assert result.exit_code == 1, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: 95.4% of 65 records rejected, over --max-reject-rate 0.2")
    assert "(missing_field 61, invalid_json 1)" in line
    assert "--format alpaca is forced on records of other formats (use --format auto)" in line
    assert (out / "manifest.json").is_file()  # kept, to inspect its rejects


def test_default_fails_a_mostly_rejected_run_in_one_line(tmp_path, packed_demo_tokenizer):
    out = tmp_path / "o"
    result = run(*pack_args(packed_demo_tokenizer, out, "--format", "alpaca"))
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(
        "error: 95.4% of 65 records rejected, over the default --max-reject-rate 0.5 "
        "(raise it to keep such a run) (missing_field 61, invalid_json 1): likely cause: "
    )
    assert sum("records rejected" in line for line in lines) == 1
    assert (out / "manifest.json").is_file()  # kept, to inspect its rejects


def test_the_option_raises_the_default(tmp_path, packed_demo_tokenizer):
    result = run(*pack_args(packed_demo_tokenizer, tmp_path / "o", "--format", "alpaca",
                            "--max-reject-rate", "1"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "records rejected" not in result.stderr


def _mixed(tmp_path: Path, bad: int, good: int = 10) -> Path:
    lines = ['{"text": "fine"}'] * good + ["not json"] * bad
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _pack_mixed(tmp_path: Path, tokenizer: Path, bad: int, *extra: str) -> object:
    return run("pack", _mixed(tmp_path, bad), "-t", tokenizer, "--max-seq-len", "64",
               "-o", tmp_path / "o", "--no-progress", "--overwrite", *extra)  # fmt: skip


def test_a_share_between_the_warning_and_the_default_only_warns(tmp_path, packed_demo_tokenizer):
    result = _pack_mixed(tmp_path, packed_demo_tokenizer, 5)  # 5 of 15: 33%
    assert result.exit_code == 0, result.output
    assert "warning: 33.3% of 15 records rejected, over 10% (runs over 50% fail" in result.stderr
    lowered = _pack_mixed(tmp_path, packed_demo_tokenizer, 5, "--max-reject-rate", "0.3")
    assert lowered.exit_code == 1
    assert "error: 33.3% of 15 records rejected, over --max-reject-rate 0.3" in lowered.stderr


def test_just_over_half_fails_and_half_does_not(tmp_path, packed_demo_tokenizer):
    assert _pack_mixed(tmp_path, packed_demo_tokenizer, 10).exit_code == 0  # 50%: not over
    assert _pack_mixed(tmp_path, packed_demo_tokenizer, 11).exit_code == 1  # 52.4%


def test_a_clean_run_says_nothing(tmp_path, packed_demo_tokenizer):
    result = run(*pack_args(packed_demo_tokenizer, tmp_path / "o", "--max-reject-rate", "0.05"))
    assert result.exit_code == 0, result.output
    assert "rejected, over" not in result.stderr  # 1 of 65 (1.5%)


def test_profile_takes_the_limit_too(packed_demo_tokenizer):
    args = ["profile", demo_data_path(), "-t", packed_demo_tokenizer, "--template", "chatml",
            "--max-seq-len", "256", "--no-progress", "--format", "text"]  # fmt: skip
    result = run(*args, "--max-reject-rate", "0.5")
    assert result.exit_code == 1
    assert "--format text is forced" in result.stderr


@pytest.mark.parametrize("value", ["-0.1", "1.5"])
def test_a_rate_outside_zero_to_one_is_a_usage_error(tmp_path, packed_demo_tokenizer, value):
    result = run(*pack_args(packed_demo_tokenizer, tmp_path / "o", "--max-reject-rate", value))
    assert result.exit_code == 2
    assert "--max-reject-rate must be between 0 and 1" in result.stderr


def test_dropped_records_do_not_count_and_causes_are_named():
    assert reject_rate_line(10, {"too_long": 9}, 0.0) == (None, False)
    line, failed = reject_rate_line(10, {"not_an_object": 10}, None)
    assert line is not None and failed and "rename it to .json" in line
    line, failed = reject_rate_line(10, {"not_an_object": 2}, None)
    assert line is not None and not failed
    assert "--max-record-bytes" in likely_cause("too_large")
    assert "wrong field name" in likely_cause("missing_field")
