from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from rich.console import Console

from packshard.profile import profile_lengths, report_to_dict
from packshard.cli.report import (
    format_count,
    render_profile_table,
    write_profile_html,
    write_profile_json,
)


@pytest.fixture
def report():
    # chat: [5 2 1], code: [12 3], "<script>": rejects only
    lengths = np.array([5, 12, 2, 3, 1])
    codes = np.array([0, 1, 0, 1, 0])
    loss = np.array([2, 6, 1, 1, 0])
    return profile_lengths(
        lengths, loss, codes, ["chat", "code"], {"<script>": 2, "chat": 1}, 8, batch_size=3
    )


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
    counts, lengths, util = rows[:4], rows[4:8], rows[8:]
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


def test_json_file_is_sorted_and_equal_to_the_dict(report, tmp_path):
    path = tmp_path / "profile.json"
    write_profile_json(report, path)
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    assert data == json.loads(json.dumps(report_to_dict(report)))
    assert text == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert [d["name"] for d in data["domains"]] == ["<script>", "chat", "code"]


def test_html_is_self_contained_with_one_histogram_per_domain(report, tmp_path):
    path = tmp_path / "profile.html"
    write_profile_html(report, path)
    page = path.read_text(encoding="utf-8")
    assert "<script>" not in page and "<script" not in page.lower()
    assert "&lt;script&gt;" in page
    assert not re.search(r"\b(src|href)=", page)
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    hists = [s for s in svgs if 'class="hist"' in s]
    # one per domain, plus the total when there are several domains
    assert [re.search(r'data-domain="([^"]*)"', s).group(1) for s in hists] == [
        "&lt;script&gt;",
        "chat",
        "code",
        "total",
    ]
    for svg in svgs:
        ET.fromstring(svg)  # well-formed XML
    for svg in hists:
        assert svg.count('class="max-seq-len"') == 1 and "max_seq_len 8" in svg
    assert "no accepted examples" in hists[0]
    assert sum('class="utilization"' in s for s in svgs) == 1
    assert page.count("<table>") == 3
    assert f'<p class="verdict">{html.escape(report.verdict)}</p>' in page


def test_histogram_bars_past_max_seq_len_are_marked(report, tmp_path):
    path = tmp_path / "profile.html"
    write_profile_html(report, path)
    page = path.read_text(encoding="utf-8")
    code = re.search(r'<svg class="hist" data-domain="code".*?</svg>', page, flags=re.S).group(0)
    bars = re.findall(r'fill="(#[0-9a-f]+)"><title>([^<]*)</title>', code)
    assert bars == [("#4878b0", "3 tokens: 1 examples"), ("#e0803a", "11–12 tokens: 1 examples")]
    assert re.search(r'<text class="over"[^>]*>1 over \(50\.0%\)</text>', code)
    chat = re.search(r'<svg class="hist" data-domain="chat".*?</svg>', page, flags=re.S).group(0)
    assert 'class="over"' not in chat


def test_single_domain_page_has_no_separate_total_histogram(tmp_path):
    report = profile_lengths(np.array([4, 4, 9]), np.array([1, 1, 1]), np.zeros(3), ["a"], {}, 8)
    path = tmp_path / "one.html"
    write_profile_html(report, path)
    assert path.read_text(encoding="utf-8").count('class="hist"') == 1
