"""Terminal tables of a profile: counts, reasoning, lengths, utilization, its rejects.

Each table has one row per domain and a bold total row; the same tables are drawn into the
profile's HTML page (:mod:`packshard.cli.html`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from packshard.profile import STRATEGIES, DomainProfile, ProfileReport


def render_rejects(report: ProfileReport) -> Group:
    """List the first rejected records of a profile with file:line, and the count per code."""
    if not report.reject_codes:
        return Group()
    total = sum(n for _, n in report.reject_codes)
    codes = ", ".join(f"{code} {n}" for code, n in report.reject_codes)
    lines: list[Any] = [Text.assemble((f"{total} rejected record(s)", "yellow"), f" ({codes}):")]
    lines += [Text(f"  {r.ref}: [{r.code}] {r.reason}") for r in report.rejects]
    if total > len(report.rejects):
        more = total - len(report.rejects)
        lines.append(Text(f"  … and {more} more (pack writes all to rejects.jsonl)"))
    return Group(*lines)


STRATEGY_LABELS = {
    "pad_to_max": "pad to max",
    "random_batches": "random",
    "bucketed": "bucketed",
    "packed": "packed",
}


def format_count(n: int) -> str:
    """Return ``n`` compactly: ``987``, ``12.3K``, ``4.56M``, ``7.89B``."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    return str(n)


def build_table(
    report: ProfileReport,
    title: str,
    caption: str,
    headers: Sequence[str],
    cells: Callable[[DomainProfile], list[str]],
) -> Table:
    """Return a table with one row per domain and a bold total row, ``cells`` filling each."""
    table = Table(title=title, caption=caption)
    table.add_column("domain", overflow="fold", min_width=8, max_width=32)
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    profiles = (*report.domains, report.total)
    for i, d in enumerate(profiles):
        table.add_row(
            Text(d.name),
            *cells(d),
            style="bold" if d is report.total else None,
            end_section=i == len(profiles) - 2,
        )
    return table


def build_counts_table(report: ProfileReport) -> Table:
    """Return the per-domain table of records, rejects and prompt/loss tokens."""

    def cells(d: DomainProfile) -> list[str]:
        tokens = (format_count(t) for t in (d.tokens, d.prompt_tokens, d.loss_tokens))
        return [f"{d.records:,}", f"{d.rejected:,}", *tokens, f"{d.loss_share:.1%}"]

    headers = ("records", "rejected", "tokens", "prompt", "loss", "loss %")
    caption = f"loss = assistant tokens ({report.label_path}), each example's first excluded"
    return build_table(report, "Records and tokens", caption, headers, cells)


def build_reasoning_table(report: ProfileReport) -> Table:
    """Return the per-domain table of examples with reasoning and reasoning's share of loss."""

    def cells(d: DomainProfile) -> list[str]:
        share = d.reasoning_examples / d.examples if d.examples else 0.0
        tokens = (format_count(d.reasoning_tokens), format_count(d.reasoning_loss_tokens))
        return [
            f"{d.reasoning_examples:,}",
            f"{share:.1%}",
            *tokens,
            f"{d.reasoning_loss_share:.1%}",
        ]

    headers = ("with reasoning", "of examples", "reasoning", "trained", "of loss")
    caption = "reasoning = tokens of rendered, non-empty reasoning blocks"
    return build_table(report, "Reasoning", caption, headers, cells)


def build_lengths_table(report: ProfileReport) -> Table:
    """Return the per-domain table of length percentiles and the share over max_seq_len."""

    def cells(d: DomainProfile) -> list[str]:
        s = d.lengths
        if s is None:
            return ["-"] * 7
        values = (s.p50, s.p90, s.p95, s.p99, s.max)
        return [*map(str, values), f"{s.mean:.0f}", f"{d.over_max_share:.1%}"]

    title = f"Example lengths in tokens (max_seq_len {report.max_seq_len})"
    caption = f"percentiles: {report.percentile_method}"
    headers = ("P50", "P90", "P95", "P99", "max", "mean", "> max")
    return build_table(report, title, caption, headers, cells)


def build_utilization_table(report: ProfileReport) -> Table:
    """Return the per-domain table of useful-token share under each strategy."""

    def cells(d: DomainProfile) -> list[str]:
        if not d.utilization:
            return ["-"] * (len(STRATEGIES) + 2)
        shares = [f"{d.strategy(s).fraction:.1%}" for s in STRATEGIES]
        return [*shares, f"{d.strategy('packed').rows:,}", f"{d.lower_bound_rows:,}"]

    title = f"Useful / computed tokens (batch_size {report.batch_size}, seed {report.seed})"
    caption = (
        "overlong examples count as truncated; rows: packed rows; "
        "min rows: ⌈useful tokens / max_seq_len⌉"
    )
    headers = (*(STRATEGY_LABELS[s] for s in STRATEGIES), "rows", "min rows")
    return build_table(report, title, caption, headers, cells)


def render_profile_table(report: ProfileReport) -> Group:
    """Return the tables (reasoning only when there is some) and the verdict as one renderable."""
    reasoning = [build_reasoning_table(report)] if report.total.reasoning_examples else []
    return Group(
        build_counts_table(report),
        *reasoning,
        build_lengths_table(report),
        build_utilization_table(report),
        Text(report.verdict, style="bold"),
    )
