"""verify says which check it is in (stderr, a terminal only) and how long each took."""

from __future__ import annotations

import io
import json
from pathlib import Path

from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.demo import demo_data_path
from packshard.verify.stages import StageClock, format_seconds


def run(*args: object) -> object:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _pack(tmp_path: Path, tokenizer: Path) -> Path:
    out = tmp_path / "out"
    args = ["pack", demo_data_path(), "-t", tokenizer, "--template", "chatml",
            "--max-seq-len", "256", "-o", out, "--no-progress"]  # fmt: skip
    assert run(*args).exit_code == 0
    return out


def test_verify_prints_each_stage_and_its_time(tmp_path, packed_demo_tokenizer):
    out = _pack(tmp_path, packed_demo_tokenizer)
    report = tmp_path / "r.json"
    result = run("verify", out, "--model", "none", "--progress", "--json", report)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    for stage in ("integrity", "structure", "source"):
        assert f"verify: {stage} …" in lines
        assert any(line.startswith(f"verify: {stage} done (") for line in lines)
    assert "verify: model …" not in lines  # --model none
    checks = json.loads(report.read_text())["checks"]
    assert all(checks[s]["seconds"] >= 0 for s in ("integrity", "structure", "source"))
    assert "seconds" not in checks["model"]
    table = [line for line in result.stdout.splitlines() if line.lstrip("│ ").startswith("source")]
    assert table and table[0].rstrip(" │").endswith(" s")  # the time column, last


def test_no_progress_in_a_pipe_by_default(tmp_path, packed_demo_tokenizer):
    out = _pack(tmp_path, packed_demo_tokenizer)
    result = run("verify", out, "--model", "none", "--no-source")
    assert result.exit_code == 0
    assert "verify:" not in result.stderr


def test_clock_adds_up_a_stage_run_in_pieces():
    stream = io.StringIO()
    clock = StageClock(True, stream)
    with clock.stage("integrity"):
        pass
    with clock.stage("integrity"):
        pass
    assert list(clock.seconds) == ["integrity"] and stream.getvalue().count("verify:") == 4
    assert format_seconds(0.041) == "0.04 s" and format_seconds(125) == "2 min 05 s"
    assert format_seconds(None) == ""
