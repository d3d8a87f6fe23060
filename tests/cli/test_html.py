"""HTML pages: ``profile --html`` (one histogram per domain) and ``inspect --html``, escaped."""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.cli.html import write_profile_html, write_row_html
from packshard.cli.inspect import inspect_row
from packshard.profile import ProfileReport, profile_lengths
from tests.helpers import small_profile


@pytest.fixture
def report() -> ProfileReport:
    return small_profile()


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


# --- inspect --html -------------------------------------------------------------------------


def test_html_page_escapes_text(tmp_path, packed_demo_tokenizer):
    from packshard.pack import PackConfig, pack_dataset

    data = tmp_path / "a&b.jsonl"
    hostile = '<script>alert("x")</script> & <b>bold</b>'
    records = [
        {
            "messages": [
                {"role": "user", "content": hostile},
                {"role": "assistant", "content": "ok"},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": hostile},
            ]
        },
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    pack_dataset(
        PackConfig.build(inputs=(str(data),), tokenizer=str(packed_demo_tokenizer), out=str(out),
                   max_seq_len=256, template="chatml")
    )  # fmt: skip
    page = tmp_path / "row.html"
    result = CliRunner().invoke(main, ["inspect", str(out), "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert f"wrote {page}" in result.stdout
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>")
    assert "<script>" not in text and "<b>" not in text
    assert text.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;b&gt;bold") == 2
    assert "&lt;|im_start|&gt;" in text
    assert f"{str(data).replace('&', '&amp;')}:1" in text and f"{data}:1" not in text
    assert text.count('<div class="seg">') == 2
    assert text.count('<span class="t">') >= 2  # trained runs are marked


def test_write_row_html_directly(packed_demo, tmp_path):
    view = inspect_row(packed_demo, row=1, shard=0)
    page = tmp_path / "r.html"
    write_row_html(view, page)
    text = page.read_text(encoding="utf-8")
    assert "<h1>shard-00000.parquet · row 1</h1>" in text
    for seg in view.segments:
        assert f"positions 0…{seg.num_tokens - 1}" in text


def test_profile_page_says_what_bucketing_assumes(report, tmp_path):
    page = tmp_path / "p.html"
    write_profile_html(report, page)
    text = page.read_text(encoding="utf-8")
    assert "bucketed is the best case of bucketing: it sorts the whole dataset by length" in text
