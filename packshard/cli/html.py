"""HTML pages: the profile (charts and tables) and an inspected row, each self-contained.

Pages use inline CSS and SVG, no script, nothing fetched.  The profile page: the verdict, the
advice the terminal prints, the useful-token share per strategy, the tables, then one length
histogram per domain on the report's log-spaced bins (≈4 per doubling, aligned)::

    count ▲            ┊ max_seq_len 4096
          │    ▆█▅     ┊
          │  ▃█████▃▁  ┊▁        bars past the line (orange) are examples that
          └──┴──┴──┴──┴┴──┴─►    would be truncated, split or dropped
             64 256 1K 4K  16K   tokens (log scale)

Every string that comes from data (domain names, decoded text, sources) is HTML-escaped.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from packshard.cli.inspect import RowView, segment_title
from packshard.cli.tables import (
    STRATEGY_LABELS,
    build_counts_table,
    build_fit_table,
    build_lengths_table,
    build_reasoning_table,
    build_utilization_table,
    build_vision_table,
)

if TYPE_CHECKING:  # imported where a profile page is drawn (it imports the planner)
    from packshard.profile.report import DomainProfile, ProfileReport

COLORS = {"bar": "#4878b0", "over": "#e0803a", "line": "#c0392b", "axis": "#555", "grid": "#ddd"}


def draw_histogram(d: DomainProfile, report: ProfileReport) -> str:
    """Return an SVG histogram of ``d``'s lengths on a log axis with the max_seq_len line."""
    width, height, left, right, top, bottom = 640, 190, 52, 16, 26, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    edges = report.histogram_edges
    first = next((i for i, c in enumerate(report.total.histogram) if c), 0)
    start = 2 ** int(math.log2(edges[first]))  # the axis starts at a power of 2 below all data
    lo, hi = math.log(start), math.log(edges[-1])

    def x_of(v: float) -> float:
        return left + (math.log(max(v, start)) - lo) / (hi - lo) * plot_w

    baseline = top + plot_h
    parts = [
        f'<svg class="hist" data-domain="{escape(d.name)}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(d.name)}: example lengths</title>"
        f'<line x1="{left}" y1="{baseline}" x2="{width - right}" y2="{baseline}" '
        f'stroke="{COLORS["axis"]}"/>'
    ]
    tick = 1
    while tick <= edges[-1]:
        if tick >= start:
            x = x_of(tick)
            label = f"{tick // 1024}K" if tick >= 1024 else str(tick)
            parts.append(
                f'<line x1="{x:.1f}" y1="{baseline}" x2="{x:.1f}" y2="{baseline + 4}" '
                f'stroke="{COLORS["axis"]}"/><text x="{x:.1f}" y="{baseline + 16}" '
                f'text-anchor="middle" class="tick">{label}</text>'
            )
        tick *= 4
    parts.append(
        f'<text x="{width - right}" y="{height - 2}" text-anchor="end" class="tick">'
        "tokens per example (log scale)</text>"
    )
    peak = max(d.histogram, default=0)
    if peak == 0:
        parts.append(
            f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" text-anchor="middle">'
            "no accepted examples</text>"
        )
    else:
        parts.append(
            f'<text x="{left - 6}" y="{top + 4}" text-anchor="end" class="tick">{peak:,}</text>'
            f'<text x="{left - 6}" y="{baseline}" text-anchor="end" class="tick">0</text>'
        )
    for i, count in enumerate(d.histogram):
        if count == 0:
            continue
        x0, x1 = x_of(edges[i]), x_of(edges[i + 1])
        h = max(count / peak * plot_h, 2.0)  # a single example stays visible
        color = COLORS["over"] if edges[i] > report.max_seq_len else COLORS["bar"]
        span = f"{edges[i]}" if edges[i + 1] - edges[i] == 1 else f"{edges[i]}–{edges[i + 1] - 1}"
        parts.append(
            f'<rect x="{x0:.1f}" y="{baseline - h:.1f}" width="{max(x1 - x0 - 0.5, 0.5):.1f}" '
            f'height="{h:.1f}" fill="{color}"><title>{span} tokens: {count:,} examples'
            "</title></rect>"
        )
    x = x_of(report.max_seq_len + 1)
    anchor, dx = ("end", -4) if x > left + plot_w * 0.75 else ("start", 4)
    parts.append(
        f'<line class="max-seq-len" x1="{x:.1f}" y1="{top - 8}" x2="{x:.1f}" y2="{baseline}" '
        f'stroke="{COLORS["line"]}" stroke-width="1.5" stroke-dasharray="5,3"/>'
        f'<text x="{x + dx:.1f}" y="{top - 10}" text-anchor="{anchor}" fill="{COLORS["line"]}" '
        f'class="tick">max_seq_len {report.max_seq_len:,}</text>'
    )
    if d.over_max:
        parts.append(
            f'<text class="over" x="{x + dx:.1f}" y="{top + 6}" text-anchor="{anchor}" '
            f'fill="{COLORS["over"]}">{d.over_max:,} over ({d.over_max_share:.1%})</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


BUCKETING_NOTE = (
    "bucketed is the best case of bucketing: it sorts the whole dataset by length before "
    "cutting batches (no sampler does that and still shuffles); a real length-grouped sampler "
    "sorts within a window of batches and lands between random and bucketed. packed needs no "
    "such assumption: its rows are what pack writes."
)
"""What the page says under the chart, so that bucketed is not read as a sampler's rate."""


def draw_utilization(d: DomainProfile) -> str:
    """Return an SVG bar chart of the useful-token share under each strategy."""
    from packshard.profile.lengths import STRATEGIES

    width, label_w, row_h, bar_w = 640, 160, 30, 400
    height = row_h * len(STRATEGIES) + 10
    parts = [
        f'<svg class="utilization" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" xmlns="http://www.w3.org/2000/svg">'
        "<title>useful-token share per strategy</title>"
    ]
    for i, strategy in enumerate(STRATEGIES):
        u = d.strategy(strategy)
        y = 5 + i * row_h
        color = COLORS["bar"] if strategy != "packed" else "#2e8b57"
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 18}" text-anchor="end">'
            f"{STRATEGY_LABELS[strategy]}</text>"
            f'<rect x="{label_w}" y="{y + 4}" width="{bar_w}" height="20" fill="#eee"/>'
            f'<rect x="{label_w}" y="{y + 4}" width="{u.fraction * bar_w:.1f}" height="20" '
            f'fill="{color}"><title>{u.useful_tokens:,} useful of {u.computed_tokens:,} '
            f"computed tokens</title></rect>"
            f'<text x="{label_w + bar_w + 8}" y="{y + 18}">{u.fraction:.1%}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def render_table_html(table: Table) -> str:
    """Return ``table``'s cells as an escaped HTML table (header row, then body rows)."""
    head = "".join(f"<th>{escape(str(c.header))}</th>" for c in table.columns)
    rows = zip(*(c.cells for c in table.columns), strict=True)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:980px;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}
.verdict{font-size:1.1em;font-weight:600;background:#f3f7f3;padding:.6em .8em;border-left:4px
 solid #2e8b57}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:3px 9px;text-align:right;
 border-bottom:1px solid #ddd}td:first-child,th:first-child{text-align:left}
tbody tr:last-child{font-weight:600;border-top:2px solid #999}
svg text{font:12px system-ui,sans-serif}svg .tick{font-size:11px;fill:#555}
.note{color:#666;font-size:.9em}.advice{background:#f6f3ea;padding:.4em .8em;border-left:4px
 solid #c9a227}
"""


def write_profile_html(report: ProfileReport, path: str | Path) -> None:
    """Write a single self-contained HTML page (no script, no external resource)."""
    total = report.total
    histograms = [*report.domains, total] if len(report.domains) > 1 else list(report.domains)
    sections = [
        f"<h3>{escape(d.name)} <span class='note'>{d.examples:,} examples, "
        f"{d.tokens:,} tokens, {d.over_max_share:.1%} over max_seq_len</span></h3>"
        + draw_histogram(d, report)
        for d in histograms or [total]
    ]
    chart = draw_utilization(total) if total.utilization else "<p>no accepted examples</p>"
    from packshard.profile.report import describe_fit
    from packshard.profile.shape import describe_shape

    advice = "".join(
        f'<p class="advice">{escape(line)}</p>'
        for line in (describe_fit(report), describe_shape(dict(report.shape)))
        if line
    )
    reasoning = ""
    if total.reasoning_examples:
        reasoning = "<h2>Reasoning per domain</h2>" + render_table_html(
            build_reasoning_table(report)
        )
    images = ""
    if report.vision:
        from packshard.profile.vision import describe_vision

        images = "<h2>Images</h2>" + render_table_html(build_vision_table(report))
        images += f'<p class="note">{escape(describe_vision(dict(report.vision)))}</p>'
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>packshard profile: max_seq_len {report.max_seq_len}</title>
<style>{STYLE}</style></head><body>
<h1>packshard profile</h1>
<p class="note">max_seq_len {report.max_seq_len:,} · batch_size {report.batch_size} ·
seed {report.seed} · {total.records:,} records, {total.rejected:,} rejected ·
percentiles {escape(report.percentile_method)} · loss tokens from {escape(report.label_path)}</p>
<p class="verdict">{escape(report.verdict)}</p>
{advice}
<h2>What max_seq_len {report.max_seq_len:,} and --overlong {escape(report.overlong)} do</h2>
{render_table_html(build_fit_table(report))}
<h2>Useful tokens per strategy (all domains)</h2>
{chart}
<p class="note">useful = Σ min(length, max_seq_len); computed = rows × width of each padded
batch, or packed rows × max_seq_len; lower bound {total.lower_bound_rows:,} rows.</p>
<p class="note">{BUCKETING_NOTE}</p>
<h2>Records and tokens per domain</h2>
{render_table_html(build_counts_table(report))}
{reasoning}
<h2>Lengths per domain</h2>
{render_table_html(build_lengths_table(report))}
<h2>Utilization per domain</h2>
{render_table_html(build_utilization_table(report))}
{images}
<h2>Length histograms</h2>
{"".join(sections)}
</body></html>
"""
    Path(path).write_text(page, encoding="utf-8")


def write_row_html(view: RowView, path: str | Path) -> None:
    """Write the row view as a self-contained HTML page."""
    blocks = []
    for seg in view.segments:
        flags = seg.reasoning or (False,) * len(seg.runs)
        runs = "".join(
            f'<span class="{"t" if trained else "c"}{" r" if thought else ""}">'
            f"{escape(text)}</span>"
            for (text, trained), thought in zip(seg.runs, flags, strict=True)
        )
        blocks.append(
            f'<div class="seg"><div class="h">{escape(segment_title(seg))}'
            f"</div><pre>{runs}</pre></div>"
        )
    reasoning = (
        " Reasoning is purple and italic (trained reasoning keeps the green background)."
        if any(seg.reasoning for seg in view.segments)
        else ""
    )
    title = f"{escape(view.shard)} row {view.row}"
    page = f"""<!doctype html><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:70em}}
.seg{{border-left:4px solid #888;margin:0 0 .5em;padding:.3em .8em}}
.seg+.seg{{border-top:3px dashed #c33;padding-top:.8em}}.h{{color:#246;font-size:.9em}}
pre{{white-space:pre-wrap;font-size:.9em}}.t{{background:#d6f5d6}}.c{{color:#888}}
.r{{color:#7b2d8e;font-style:italic}}</style>
<h1>{escape(view.shard)} · row {view.row}</h1>
<p>{view.num_tokens} of {view.max_seq_len} tokens, {len(view.segments)} segments. Trained tokens
have a green background; red dashed lines are seams (attention and positions restart).
{reasoning}</p>
{"".join(blocks)}
"""
    Path(path).write_text(page, encoding="utf-8")
