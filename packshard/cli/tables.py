"""Terminal tables of ``profile``, ``pack`` and ``verify`` results (rich renderables).

A profile's tables have one row per domain and a bold total row; they are also drawn into its
HTML page (:mod:`packshard.cli.html`).  On a terminal, tables fit its width and colours carry
meaning; in a pipe the console is as wide as the longest line (:data:`PIPE_WIDTH`), has no
colour, and what colour alone meant is written out (``inspect`` brackets trained text:
:data:`packshard.cli.inspect.TRAINED_MARKS`)::

    terminal: │ records read         │   65 │   (wrapped to the window, coloured)
    pipe:     one line per row, however long; no escape codes
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from packshard.cli.errors import one_line, printable
from packshard.options import CHECKS

if TYPE_CHECKING:  # the profile tables import it when they render (it imports the planner)
    from packshard.profile.report import DomainProfile, ProfileReport


_PAIR_KEYS = ("seen", "packed", "rejected")


def render_pack_summary(result: Any) -> Group:
    """Render the counts, rows, fill rate and reject codes of a finished ``pack``."""
    stats = result.manifest["stats"]
    table = Table(title=f"packed → {result.shown}", show_header=False, title_justify="left")
    table.add_column("what", style="cyan")
    table.add_column("value", justify="right")
    rows = [
        ("records read", stats["records"]),
        ("records packed", stats["records_packed"]),
        ("rejected (bad input)", stats["rejected"]),
        ("dropped (policy)", stats["dropped"]),
        ("examples (incl. parts)", stats["examples"]),
        ("truncated / split", f"{stats['truncated']:,} / {stats['split']:,}"),
        ("tokens", stats["tokens"]),
        ("loss tokens", stats["loss_tokens"]),
        ("rows", stats["rows"]),
        ("lower bound rows", stats["lower_bound_rows"]),
        ("fill rate", f"{100 * stats['fill_rate']:.2f}%"),
    ]
    if parent := result.manifest.get("parent"):
        rows.insert(0, ("repacked from", str(parent["path"])))
    if "bfd_fill_rate" in stats:
        rows.append(("fill rate with bfd", f"{100 * stats['bfd_fill_rate']:.2f}% (order not kept)"))
    rows.append(("shards", len(result.manifest["shards"])))
    if p := stats.get("pairs"):
        rows.append(("pairs seen / packed / rejected", " / ".join(f"{p[k]:,}" for k in _PAIR_KEYS)))
    if v := stats.get("vision"):
        rows.append(("images / vision tokens", f"{v['images']:,} / {v['vision_tokens']:,}"))
        caps = v.get("caps", {})
        for key, name, cap in (
            ("per_row_images", "images a row", "max_images_per_row"),
            ("per_row_vision_tokens", "vision tokens a row", "max_vision_tokens_per_row"),
        ):
            per_row = v[key]
            shown = f"{per_row['max']:,} / {per_row['mean']:,.1f}"
            rows.append(
                (f"{name}, max / mean", shown + (f" (cap {caps[cap]:,})" if cap in caps else ""))
            )
    if "splits" in stats:
        split = " / ".join(f"{stats['splits'][k]['records_packed']:,}" for k in ("train", "eval"))
        rows.append(("train / eval records", split))
    rows.append(("time", f"{result.seconds:.2f} s"))
    rows.append(("tokens/s", f"{stats['tokens'] / max(result.seconds, 1e-9):,.0f}"))
    for name, value in rows:  # counts, or text already formatted
        table.add_row(name, f"{value:,}" if isinstance(value, int) else value)
    parts: list[Any] = [table]
    if codes := stats.get("rejects_by_code"):
        listed = ", ".join(
            f"{code} {n}" for code, n in sorted(codes.items(), key=lambda kv: -kv[1])
        )
        parts.append(Text(f"rejects by code: {listed} (see {result.shown}/rejects.jsonl)"))
    if stats.get("reasoning_dropped"):
        parts.append(
            Text(
                f"reasoning: {_count(stats['reasoning_dropped'], 'trained turn')} rendered "
                "without the reasoning their template leaves out of history (--turns expand "
                "trains each turn with it)",
                style="yellow",
            )
        )
    check = stats["records"] == stats["records_packed"] + stats["rejected"] + stats["dropped"]
    parts.append(
        Text(
            f"counts add up: {stats['records']:,} = {stats['records_packed']:,} packed + "
            f"{stats['rejected']:,} rejected + {stats['dropped']:,} dropped",
            style="green" if check else "bold red",
        )
    )
    return Group(*parts)


def render_verify_summary(report: Any) -> Group:
    """Render one line per check, the control's leak size, and the first findings."""
    from packshard.verify.stages import format_seconds  # verify's package: not for pack

    table = Table(title=f"verify {one_line(str(report.out))}", title_justify="left")
    table.add_column("check", style="cyan")
    table.add_column("status")
    table.add_column("detail")
    table.add_column("time", justify="right")
    for name in CHECKS:
        if name == "vision" and name not in report.checks:
            continue  # a pack without images has no vision stage
        info = report.checks.get(name, {"status": "skipped"})
        status = info.get("status", "?")
        style = {"passed": "green", "failed": "bold red"}.get(status, "yellow")
        spent = format_seconds(info.get("seconds"))
        table.add_row(name, Text(status, style=style), _detail(name, info), spent)
    parts: list[Any] = [table]
    model = report.checks.get("model", {})
    if model.get("control_detected"):
        parts.append(
            Text(
                f"control: a naive causal mask over the same rows leaks — logits move by up to "
                f"{model['control_max_delta']:.3g} (at least {model['control_min_delta']:.3g} per "
                f"multi-segment row) vs ≤ {model['max_logit_delta']:.2g} with seams isolated; "
                f"loss {_fmt(model.get('loss_naive'))} naive vs "
                f"{_fmt(model.get('loss_true'))} true",
                style="magenta",
            )
        )
    parts += [Text(f"note: {one_line(note)}", style="yellow") for note in model.get("notes", [])]
    parts += render_environment(report)
    findings = report.findings
    parts += [Text(f"✗ {one_line(str(finding))}", style="red") for finding in findings.items[:30]]
    hidden = len(findings) - min(len(findings.items), 30)
    if hidden > 0:
        parts.append(
            Text(f"… and {_count(hidden, 'more finding')} (use --json for all)", style="red")
        )
    for name, why in report.not_run.items():
        parts.append(Text(f"not run: {name}: {one_line(why)}", style="bold yellow"))
    if len(findings):
        verdict = f"FAILED: {_count(len(findings), 'finding')}"
    elif report.not_run:
        verdict = f"NOT VERIFIED: {_count(len(report.not_run), 'check')} did not run (see above)"
    else:
        verdict = "OK: every seam holds"
    parts.append(Text(verdict, style="bold green" if report.ok else "bold red"))
    return Group(*parts)


def render_environment(report: Any) -> list[Text]:
    """Return the line of versions verify ran with, then one line per drifted version."""
    env = report.environment
    if not env:
        return []
    versions = ", ".join(f"{name} {v}" for name, v in env["libraries"].items() if v is not None)
    line = (
        f"ran with python {env['python']}, packshard {env['packshard']}, {versions}; template "
        f"conventions {env['template_conventions']['id']}"
    )
    recorded = "environment" in report.manifest
    if recorded and not report.drift:
        line += " (as when packed)"
    lines = [Text(one_line(line), style="dim")]
    if not recorded:
        lines.append(
            Text(
                "note: the manifest records no environment (packed before packshard recorded "
                "one): drift cannot be named",
                style="yellow",
            )
        )
    lines += [Text(f"drift: {one_line(str(d))}", style="yellow") for d in report.drift]
    source = report.checks.get("source", {}).get("status")
    if report.drift and source == "passed":
        lines.append(Text("drift: the source check re-made every example compared: none changed"))
    elif report.drift and source != "failed":
        lines.append(
            Text(
                "drift: the source check did not run, so whether these versions change the "
                "pack is unknown (re-verify with the inputs)",
                style="yellow",
            )
        )
    return lines


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _detail(name: str, info: dict[str, Any]) -> str:
    if info.get("status") in ("skipped", "not run"):
        return str(info.get("detail", ""))
    if name == "source" and "examples_compared" in info:
        done = f"{info['examples_compared']:,} examples re-tokenized and compared"
        if info.get("turns_checked"):
            done += f"; {_count(info['turns_checked'], 'assistant turn')} checked"
            if info.get("reasoning_blocks_checked"):
                done += f" ({_count(info['reasoning_blocks_checked'], 'reasoning block')})"
        return done
    if name == "model" and "rows" in info:
        text = (
            f"{info['rows']} rows; max |Δlogit| packed vs alone {info['max_logit_delta']:.2g} "
            f"(atol {info['atol']:.0e}); neighbour mutation {_fmt(info.get('max_mutation_delta'))}"
        )
        kinds = info.get("layer_kinds")
        if isinstance(kinds, dict) and kinds:
            text += "; layers checked: " + ", ".join(f"{k} ×{n}" for k, n in kinds.items())
        control = info.get("boundary_control")
        if isinstance(control, dict):
            text += (
                f"; seams withheld from {', '.join(control['layers'])}: logits move by "
                f"{control['max_logit_delta']:.2g} (first at {control['first']})"
            )
        pairs = info.get("pairs")
        if isinstance(pairs, dict):
            text += (
                f"; {_count(pairs['pairs'], 'pair')}: max |Δ sum logp| "
                f"{pairs['max_pair_logp_delta']:.2g}, max |Δ DPO loss| "
                f"{pairs['max_pair_loss_delta']:.2g}; naive control moved "
                f"{pairs['control_pairs_moved']} of {pairs['pairs']} by >= 1e-2"
            )
        return text
    if name == "vision" and "rows" in info:
        moved = info["controls_moved"]
        return (
            f"{_count(info['images_checked'], 'image')} re-hashed; {info['rows']} rows with "
            f"several segments, {info['images']} images: max |Δlogit| packed vs alone "
            f"{info['max_logit_delta']:.2g} (atol {info['atol']:.0e}); controls moved by >= 1e-2: "
            + ", ".join(f"{k.replace('_', ' ')} {v}/{info['rows']}" for k, v in moved.items())
        )
    if name == "vision" and "images_checked" in info:
        return f"{_count(info['images_checked'], 'image')} re-hashed; " + _count(
            int(info.get("findings", 0)), "finding"
        )
    return _count(int(info.get("findings", 0)), "finding")


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def render_rejects(report: ProfileReport) -> Group:
    """List the first rejected records of a profile with file:line, and the count per code."""
    if not report.reject_codes:
        return Group()
    total = sum(n for _, n in report.reject_codes)
    codes = ", ".join(f"{code} {n}" for code, n in report.reject_codes)
    lines: list[Any] = [Text.assemble((f"{total} rejected record(s)", "yellow"), f" ({codes}):")]
    lines += [Text(f"  {r.ref}: [{r.code}] {r.reason}") for r in report.rejects]
    if (more := total - len(report.rejects)) > 0:
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


def build_fit_table(report: ProfileReport) -> Table:
    """Return the per-domain table of what max_seq_len and --overlong do, and a length to keep."""
    from packshard.profile.report import KEEP_SHARE, overlong_effect

    def cells(d: DomainProfile) -> list[str]:
        if not d.examples:
            return ["-", "-", "-"]
        effect = overlong_effect(d, report.overlong, report.max_seq_len)
        return [f"{d.over_max:,} ({d.over_max_share:.1%})", effect, f"{d.keep_length:,}"]

    headers = ("over max_seq_len", f"--overlong {report.overlong}", f"keeps {KEEP_SHARE:.0%} whole")
    title = f"Fit to max_seq_len {report.max_seq_len} (what pack would do)"
    caption = (
        f"keeps {KEEP_SHARE:.0%} whole: the smallest max_seq_len that leaves that share intact"
    )
    return build_table(report, title, caption, headers, cells)


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
    from packshard.profile.lengths import STRATEGIES

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


def render_mixture(mix: dict[str, Any], title: str) -> Table:
    """Return the ``--mix`` mixture before and after, a row per domain (``stats.mix``)."""
    by = mix["by"]
    table = Table(title=title, caption=f"shares of {by.replace('_', ' ')} (after: packed)")
    table.add_column("domain", overflow="fold", min_width=8, max_width=32)
    for header in ("target", "before", "after", "tokens", "examples", "repeats", "dropped"):
        table.add_column(header, justify="right", no_wrap=True)
    for name, d in mix["domains"].items():
        shares = [d[k] for k in ("target", "share_input", f"share_{by}")]
        shares += [d["share_tokens"], d["share_examples"]]
        counts = (d["repeats"], d["records_dropped"])
        table.add_row(Text(name), *(f"{v:.2%}" for v in shares), *(f"{n:,}" for n in counts))
    return table


def render_profile_table(report: ProfileReport) -> Group:
    """Return the tables (reasoning only when there is some) and the verdict as one renderable."""
    from packshard.profile.pairs import describe_pairs
    from packshard.profile.report import describe_fit
    from packshard.profile.shape import describe_shape

    reasoning = [build_reasoning_table(report)] if report.total.reasoning_examples else []
    mix = report.mixture and [render_mixture(dict(report.mixture), "Mixture --mix would pack")]
    return Group(
        *(mix or []),
        build_counts_table(report),
        *reasoning,
        build_lengths_table(report),
        build_fit_table(report),
        build_utilization_table(report),
        Text(report.verdict, style="bold"),
        Text(describe_fit(report)),
        Text(describe_shape(dict(report.shape))),
        *([Text(describe_pairs(dict(report.pairs), report.batch_size))] if report.pairs else []),
        *([build_vision_table(report)] if report.vision else []),
    )


def build_vision_table(report: ProfileReport) -> Table:
    """Return the images table of a profile: vision tokens, image sizes, padded batches."""
    v = report.vision
    pad = v["padded_batch"]
    table = Table(title="Images (vision tokens: one per merged patch)", title_justify="left")
    table.add_column("figure", overflow="fold")
    table.add_column("value", overflow="fold")

    def spread(d: dict[str, Any], unit: str = "") -> str:
        return " / ".join(f"{d[k]:,}{unit}" for k in d if k != "total")

    size = v["image_size"]
    per = v["vision_tokens_per_example"]
    rows = [
        ("examples with images / images", f"{v['examples_with_images']:,} / {v['images']:,}"),
        (
            "vision tokens (share of all tokens)",
            f"{v['vision_tokens']:,} ({v['vision_share']:.1%})",
        ),
        ("vision tokens an example, P50 / P90 / P99 / max", spread(per)),
        ("images an example, P50 / P90 / max", spread(v["images_per_example"])),
        (
            "image size by area, P50 / P90 / max (px)",
            " / ".join("×".join(map(str, size[k])) for k in ("p50", "p90", "max")),
        ),
        ("image bytes, P50 / P90 / max (total)", f"{spread(v['bytes'])} ({v['bytes']['total']:,})"),
        (
            f"padded VLM batch of {pad['batch_size']}: padding share",
            f"{pad['padding_share']:.1%} of {pad['computed_tokens']:,} computed tokens",
        ),
        (
            "vision tokens a padded batch, max / mean",
            f"{pad['vision_tokens_max']:,} / {pad['vision_tokens_mean']:,.1f}",
        ),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


PIPE_WIDTH = 4096
"""Columns of the console in a pipe: wide enough that no table or line is wrapped."""


def plain() -> bool:
    """Whether stdout is not a terminal (a pipe, a file, a log)."""
    return not sys.stdout.isatty()


class SafeConsole(Console):
    """A console that escapes, in every piece of text it renders, what a terminal acts on.

    Strings from manifests and inputs pass through :func:`~packshard.cli.errors.printable`;
    only the console's own control segments reach the terminal as they are.
    """

    def render(self, renderable: Any, options: Any = None) -> Iterator[Segment]:
        """Render as rich does, the text of every segment made printable."""
        for segment in super().render(renderable, options):
            if segment.control or segment.text.isprintable() or segment.text == "\n":
                yield segment
            else:
                yield Segment(printable(segment.text), segment.style, segment.control)


def console(quiet: bool = False) -> Any:
    """Return the console the commands print to (see the module docstring); ``quiet``: none."""
    if not plain():
        return SafeConsole(highlight=False, soft_wrap=False, quiet=quiet)

    class PlainConsole(SafeConsole):
        def print(self, *objects: Any, **kwargs: Any) -> None:
            for item in objects:
                unwrap(item)
            super().print(*objects, **kwargs)

    return PlainConsole(
        highlight=False, soft_wrap=False, width=PIPE_WIDTH, color_system=None, quiet=quiet
    )


def unwrap(renderable: Any) -> None:
    """Let every column of the tables in ``renderable`` be as wide as its longest cell."""
    if isinstance(renderable, Group):
        for item in renderable.renderables:
            unwrap(item)
    elif isinstance(renderable, Table):
        for column in renderable.columns:
            column.max_width, column.no_wrap, column.overflow = None, True, "ignore"
