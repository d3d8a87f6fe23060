"""HTML pages: ``profile --html`` (one histogram per domain) and ``inspect --html``, escaped."""

from __future__ import annotations

import html
import html.parser
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
    assert page.count("<table>") == 4
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


# --- the advice: what max_seq_len and --overlong do, a length to keep -------------------------


def _advised(overlong: str) -> ProfileReport:
    """chat: 8 short examples; code: 4 of 5 fit in 100 tokens, one is 300 (20% over)."""
    lengths = np.array([10, 20, 30, 40, 50, 60, 70, 80, 50, 60, 70, 90, 300])
    codes = np.array([0] * 8 + [1] * 5)
    loss = lengths // 2
    return profile_lengths(lengths, loss, codes, ["chat", "code"], {}, 100, overlong=overlong)


class _Text(html.parser.HTMLParser):
    """The page's visible text, one string per table row or paragraph."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[str] = []
        self._open = False

    def handle_starttag(self, tag, attrs) -> None:
        if tag in ("tr", "p", "h2"):
            self.blocks.append("")
            self._open = True
        elif tag == "td" and self._open:
            self.blocks[-1] += " | "

    def handle_endtag(self, tag) -> None:
        if tag in ("tr", "p", "h2"):
            self._open = False

    def handle_data(self, data) -> None:
        if self._open:
            self.blocks[-1] += data


def _page_text(report: ProfileReport, path) -> list[str]:
    write_profile_html(report, path)
    parser = _Text()
    parser.feed(path.read_text(encoding="utf-8"))
    return [" ".join(b.split()) for b in parser.blocks]


@pytest.mark.parametrize(
    ("overlong", "code_row"),
    [
        ("drop", "drops 1 of 5 examples (20.0%), 300 tokens (52.6%)"),
        ("truncate", "truncates 1 of 5 examples (20.0%), cutting 200 tokens (35.1%)"),
        ("split", "splits 1 of 5 examples (20.0%) into 3 parts"),
        ("error", "stops pack: 1 of 5 examples (20.0%) are longer"),
    ],
)
def test_the_page_states_per_domain_what_the_policy_does(tmp_path, overlong, code_row):
    text = _page_text(_advised(overlong), tmp_path / "p.html")
    start = text.index(f"What max_seq_len 100 and --overlong {overlong} do")
    table = text[start + 1 : text.index("Useful tokens per strategy (all domains)")]
    rows = {b[2:].split(" | ")[0]: b for b in table if b.startswith("| ")}
    assert code_row in rows["code"] and rows["code"].endswith(" | 300")
    assert "none over: every example kept whole | 80" in rows["chat"]
    assert rows["total"].endswith(" | 300")  # 13 examples: the 13th keeps 99%


def test_the_page_suggests_a_length_and_gives_the_terminal_lines(tmp_path):
    report = _advised("drop")
    text = _page_text(report, tmp_path / "p.html")
    fit = next(b for b in text if b.startswith("max_seq_len 300 keeps 99%"))
    assert "(the smallest that does; 100 keeps 92.3%)" in fit
    assert "rows per optimizer step (--batch-size)" in fit
    assert any(b.startswith("row fill min / p10 / median / p90 / max:") for b in text)


def test_a_real_browser_shows_the_advice(tmp_path):
    """Headless Chromium renders the page; its DOM text holds the advice."""
    import shutil
    import subprocess

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    path = tmp_path / "p.html"
    write_profile_html(_advised("truncate"), path)
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", path.as_uri()]
    dom = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "truncates 1 of 5 examples (20.0%), cutting 200 tokens (35.1%)" in dom
    assert "max_seq_len 300 keeps 99% of examples whole" in dom
