"""Ingest progress: a bar on a terminal, periodic plain lines with an estimate in a log."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.ingest import progress as progress_module
from packshard.ingest.progress import IngestProgress, human_count, progress_mode


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("progress", "tty", "mode"),
    [
        (None, True, "bar"),
        (None, False, "lines"),  # a pipe, a file, a CI log
        (True, False, "lines"),  # --progress in a log: lines too
        (True, True, "bar"),
        (False, True, "off"),
        ("lines", True, "lines"),
    ],
)
def test_the_mode_follows_the_stream(progress, tty, mode) -> None:
    assert progress_mode(progress, _Stream(tty)) == mode


def test_a_line_has_counts_rates_share_and_an_estimate() -> None:
    bar = IngestProgress("lines", total_bytes=4_000_000, stream=io.StringIO(), every=3600)
    first = bar.line()
    assert first.startswith("ingest: 0 records, 0 tokens, 0% of 4.0MB in ")
    assert first.endswith(", estimate after the first unit")
    bar.add(250_000, 31_000_000, 1_000_000)
    bar._start -= 10.0  # ten seconds in: a quarter done, about thirty seconds left
    line = bar.line()
    assert line.startswith("ingest: 250,000 records, 31,000,000 tokens, 25% of 4.0MB in 10 s")
    assert re.search(r"\(2[45]\.\dk records/s, 3\.\dM tokens/s\), about 3\d s left$", line), line
    bar.close()


def test_lines_come_periodically_and_end_with_done() -> None:
    stream = io.StringIO()
    bar = IngestProgress("lines", total_bytes=100, stream=stream, every=0.01)
    bar.add(3, 30, 50)
    deadline = time.monotonic() + 5
    while stream.getvalue().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 3
    assert all(line.startswith("ingest: 3 records, 30 tokens") for line in lines)
    assert "50% of 100B" in lines[0] and "left" in lines[0]
    assert ", done in " in lines[-1]


def test_a_short_run_in_a_log_prints_nothing() -> None:
    stream = io.StringIO()
    bar = IngestProgress("lines", total_bytes=100, stream=stream, every=3600)
    bar.add(3, 30, 100)
    bar.close()
    assert stream.getvalue() == ""


def test_counts_read_at_a_glance() -> None:
    assert [human_count(v) for v in (412, 38_100, 5_200_000, 2.5e9)] == [
        "412",
        "38.1k",
        "5.2M",
        "2.5G",
    ]


def _pack(tmp_path: Path, tokenizer: Path, *extra: str):
    from packshard.demo import demo_data_path

    args = ["pack", str(demo_data_path()), "-t", str(tokenizer), "--template", "chatml",
            "--max-seq-len", "256", "-o", str(tmp_path / "o"), "--overwrite",
            "--split-bytes", "4096", "--workers", "1", *extra]  # fmt: skip
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_pack_in_a_log_leaves_progress_lines(tmp_path, packed_demo_tokenizer, monkeypatch):
    monkeypatch.setattr(progress_module, "LINE_SECONDS", 0.001)
    result = _pack(tmp_path, packed_demo_tokenizer)  # stderr is no terminal here
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("ingest: ")]
    assert lines, result.stderr
    assert lines[-1].startswith("ingest: 65 records, ") and ", done in " in lines[-1]
    assert all(re.match(r"ingest: [\d,]+ records, [\d,]+ tokens, ", ln) for ln in lines)


def test_quiet_prints_neither_progress_nor_summary(tmp_path, packed_demo_tokenizer, monkeypatch):
    monkeypatch.setattr(progress_module, "LINE_SECONDS", 0.001)
    result = _pack(tmp_path, packed_demo_tokenizer, "--quiet")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "ingest: " not in result.stderr
    assert (tmp_path / "o" / "manifest.json").is_file()


def test_the_bar_takes_a_total_and_counts(capsys) -> None:
    bar = IngestProgress("bar", total_bytes=100)
    bar.add(3, 30, 40)
    assert bar.line().startswith("ingest: 3 records, 30 tokens, 40% of 100B")
    bar.close()


def test_times_read_as_people_say_them() -> None:
    from packshard.ingest.progress import human_seconds

    assert [human_seconds(v) for v in (4.4, 59.6, 125, 3599, 11_220)] == [
        "4 s",
        "1 min 00 s",
        "2 min 05 s",
        "59 min 59 s",
        "3 h 07 min",
    ]
