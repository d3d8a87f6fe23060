"""Console tables of ``profile``: counts, lengths and utilization per domain, exact text."""

from __future__ import annotations

import pytest
from rich.console import Console

from packshard.cli.tables import format_count, render_profile_table
from packshard.profile import ProfileReport
from tests.helpers import small_profile


@pytest.fixture
def report() -> ProfileReport:
    return small_profile()


def render_text(renderable) -> str:
    console = Console(record=True, width=120)
    console.print(renderable)
    return console.export_text()


def test_format_count():
    assert [format_count(n) for n in (0, 987, 12_345, 4_560_000, 7_890_000_000)] == [
        "0",
        "987",
        "12.3K",
        "4.56M",
        "7.89B",
    ]


def test_rich_tables_show_each_domain_and_the_total(report):
    text = render_text(render_profile_table(report))
    rows = [
        [c.strip() for c in line.split("│")[1:-1]]
        for line in text.splitlines()
        if line.startswith("│")
    ]
    counts, lengths, fit, util = rows[:4], rows[4:8], rows[8:12], rows[12:]
    # domain | records rejected tokens prompt loss loss%
    assert counts == [
        ["<script>", "2", "2", "0", "0", "0", "0.0%"],
        ["chat", "4", "1", "8", "5", "3", "37.5%"],
        ["code", "2", "0", "15", "8", "7", "46.7%"],
        ["total", "8", "3", "23", "13", "10", "43.5%"],
    ]
    # domain | P50 P90 P95 P99 max mean >max
    assert lengths == [
        ["<script>", "-", "-", "-", "-", "-", "-", "-"],
        ["chat", "2", "5", "5", "5", "5", "3", "0.0%"],
        ["code", "3", "12", "12", "12", "12", "8", "50.0%"],
        ["total", "3", "12", "12", "12", "12", "5", "20.0%"],
    ]
    # domain | over max_seq_len, what --overlong drop does, the length that keeps 99% whole
    assert fit == [
        ["<script>", "-", "-", "-"],
        ["chat", "0 (0.0%)", "none over: every example kept whole", "5"],
        ["code", "1 (50.0%)", "drops 1 of 2 examples (50.0%), 12 tokens (80.0%)", "12"],
        ["total", "1 (20.0%)", "drops 1 of 5 examples (20.0%), 12 tokens (52.2%)", "12"],
    ]
    # useful: chat 8, code 3 + 8 = 11, total 19.  chat: pad 8/24, one batch of 3 → 8/15,
    # 1 row.  code: pad 11/16, batch [12→8, 3] → 11/16, rows 2.  total: pad 19/40; 3 rows.
    assert util == [
        ["<script>", "-", "-", "-", "-", "-", "-"],
        ["chat", "33.3%", "53.3%", "53.3%", "100.0%", "1", "1"],
        ["code", "68.8%", "68.8%", "68.8%", "68.8%", "2", "2"],
        ["total", "47.5%", "76.0%", "76.0%", "79.2%", "3", "3"],
    ]
    assert "Example lengths in tokens (max_seq_len 8)" in text
    assert "Useful / computed tokens (batch_size 3, seed 0)" in text
    assert "packing removes 40% of computed tokens vs padding to max_seq_len 8" in text
