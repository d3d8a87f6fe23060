"""Command line interface: a thin click layer over the library API.

Every command turns :class:`~packshard.errors.PackshardError` into a one-line message on
stderr and its exit code (1 data or audit failure, 2 usage) in one place,
:class:`_Group.invoke`.  Terminal output uses rich; ``--json`` options write machine-readable
results.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from packshard.errors import EXIT_DATA, PackshardError

SHARED_INGEST = [
    click.option(
        "--tokenizer",
        "-t",
        required=True,
        help="tokenizer.json, or a folder holding it with tokenizer_config.json.",
    ),
    click.option(
        "--template",
        default=None,
        help="Chat template: a .jinja file or 'chatml' (default: the tokenizer config's).",
    ),
    click.option("--max-seq-len", type=int, required=True, help="Row capacity in tokens."),
    click.option(
        "--format",
        "fmt",
        default="auto",
        show_default=True,
        type=click.Choice(["auto", "messages", "sharegpt", "alpaca", "prompt_completion", "text"]),
        help="Record format (detected per record by default).",
    ),
    click.option(
        "--domain-field",
        default="domain",
        show_default=True,
        help="Record field naming its domain (else the file name).",
    ),
    click.option(
        "--loss",
        default="auto",
        show_default=True,
        type=click.Choice(["auto", "assistant", "last_assistant", "all", "completion"]),
        help="Which tokens are trained.",
    ),
    click.option(
        "--on-error",
        default="skip",
        show_default=True,
        type=click.Choice(["skip", "fail"]),
        help="skip: bad records go to the rejects; fail: stop at the first (exit 1).",
    ),
]


_progress_option = click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar (default: when stderr is a terminal).",
)


def _ingest_options(func: Any) -> Any:
    for option in reversed(SHARED_INGEST):
        func = option(func)
    return func


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def _fail(exc: PackshardError) -> NoReturn:
    # One unwrapped line: messages start with ``file:line`` and must stay greppable.
    click.secho("error:", fg="red", bold=True, err=True, nl=False)
    click.echo(f" {exc}", err=True)
    sys.exit(exc.exit_code)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PackshardError as exc:
            _fail(exc)


@click.group(cls=_Group)
@click.version_option(package_name="packshard")
def main() -> None:
    """Pack chat fine-tuning data into audited, seam-safe Parquet shards.

    \b
    Example:
      packshard profile data/*.jsonl -t tok/ --max-seq-len 4096
      packshard pack data/*.jsonl -t tok/ --max-seq-len 4096 -o packed/
      packshard verify packed/
    """


@main.command()
@click.argument("data", nargs=-1, required=True)
@_ingest_options
@click.option(
    "--batch-size",
    type=int,
    default=8,
    show_default=True,
    help="Training batch size assumed by the padding estimates.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the random-batch estimate."
)
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False), help="Write the report as JSON."
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    help="Write an HTML page with histograms and charts.",
)
@_progress_option
def profile(
    data: tuple[str, ...],
    tokenizer: str,
    template: str | None,
    max_seq_len: int,
    fmt: str,
    domain_field: str,
    loss: str,
    on_error: str,
    batch_size: int,
    seed: int,
    json_path: str | None,
    html_path: str | None,
    progress: bool | None,
) -> None:
    """Length quantiles per domain and the padding waste packing would remove.

    \b
    Example:
      packshard profile chat.jsonl code.jsonl -t tokenizer/ --max-seq-len 4096 --html profile.html
    """
    from packshard.ingest.chunks import IngestOptions
    from packshard.profile import profile_inputs
    from packshard.cli.report import render_profile_table, write_profile_html, write_profile_json
    from packshard.ingest.sources import expand_inputs
    from packshard.ingest.templates import load_template
    from packshard.ingest.tokenizer import load_tokenizer

    files = expand_inputs(data)
    bundle = load_tokenizer(tokenizer)
    tmpl = load_template(template, bundle)
    options = IngestOptions(format=fmt, domain_field=domain_field, loss=loss, on_error=on_error)
    show = sys.stderr.isatty() if progress is None else progress
    report = profile_inputs(files, bundle, tmpl, options, max_seq_len, batch_size, seed, show)
    console = _console()
    console.print(render_profile_table(report))
    _print_rejects(console, report)
    if json_path:
        write_profile_json(report, json_path)
        click.echo(f"wrote {json_path}")
    if html_path:
        write_profile_html(report, html_path)
        click.echo(f"wrote {html_path}")


def _print_rejects(console: Any, report: Any) -> None:
    """List the first rejected records with file:line, and the count per code."""
    if not report.reject_codes:
        return
    total = sum(n for _, n in report.reject_codes)
    codes = ", ".join(f"{code} {n}" for code, n in report.reject_codes)
    console.print(f"[yellow]{total} rejected record(s)[/] ({codes}):", highlight=False)
    for reject in report.rejects:
        console.print(f"  {reject.ref}: [{reject.code}] {reject.reason}", markup=False)
    if total > len(report.rejects):
        console.print(
            f"  … and {total - len(report.rejects)} more (pack writes all to rejects.jsonl)"
        )


@main.command()
@click.argument("data", nargs=-1, required=True)
@_ingest_options
@click.option(
    "-o",
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help="Output folder (written atomically).",
)
@click.option(
    "--strategy",
    default="bfd",
    show_default=True,
    type=click.Choice(["bfd", "ffd", "wrapped"]),
    help="Packing algorithm.",
)
@click.option(
    "--overlong",
    default="drop",
    show_default=True,
    type=click.Choice(["drop", "truncate", "split", "error"]),
    help="What to do with examples longer than --max-seq-len.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the row shuffle.")
@click.option("--group-by-domain", is_flag=True, help="Rows hold examples of one domain each.")
@click.option(
    "--shard-rows", type=int, default=8192, show_default=True, help="Most rows per shard."
)
@click.option(
    "--shard-bytes",
    type=int,
    default=256 * 1024 * 1024,
    show_default=True,
    help="Approximate most bytes per shard.",
)
@click.option(
    "--compression",
    default="zstd",
    show_default=True,
    type=click.Choice(["zstd", "snappy", "none"]),
    help="Parquet compression of the shards.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace a non-empty output folder (only once the new one is complete).",
)
@click.option(
    "--num-workers", type=int, default=None, help="Tokenizer threads (default: all cores)."
)
@_progress_option
def pack(
    data: tuple[str, ...],
    tokenizer: str,
    template: str | None,
    max_seq_len: int,
    fmt: str,
    domain_field: str,
    loss: str,
    on_error: str,
    out: str,
    strategy: str,
    overlong: str,
    seed: int,
    group_by_domain: bool,
    shard_rows: int,
    shard_bytes: int,
    compression: str,
    overwrite: bool,
    num_workers: int | None,
    progress: bool | None,
) -> None:
    """Tokenize, pack and write Parquet shards with an examples index, rejects and a manifest.

    \b
    Example:
      packshard pack chat.jsonl -t tokenizer/ --max-seq-len 4096 -o packed/ --overlong split
    """
    from packshard.pack.pipeline import PackConfig, pack_dataset

    config = PackConfig(
        inputs=data,
        tokenizer=tokenizer,
        out=out,
        max_seq_len=max_seq_len,
        template=template,
        strategy=strategy,
        overlong=overlong,
        loss=loss,
        seed=seed,
        group_by_domain=group_by_domain,
        format=fmt,
        domain_field=domain_field,
        on_error=on_error,
        shard_rows=shard_rows,
        shard_bytes=shard_bytes,
        compression=compression,
        overwrite=overwrite,
        num_workers=num_workers,
    )
    show = sys.stderr.isatty() if progress is None else progress
    result = pack_dataset(config, progress=show)
    from packshard.cli.tables import render_pack_summary

    for warning in result.warnings:
        click.secho("warning:", fg="yellow", err=True, nl=False)
        click.echo(f" {warning}", err=True)
    _console().print(render_pack_summary(result))


@main.command()
@click.argument("out", type=click.Path())
@click.option(
    "--source/--no-source",
    default=None,
    help="Re-ingest the inputs and compare (default: when they are found).",
)
@click.option(
    "--source-root",
    type=click.Path(file_okay=False),
    help="Folder to find the recorded inputs, tokenizer and template in by name.",
)
@click.option(
    "--tokenizer", default=None, help="Tokenizer to use for the source check (its hash must match)."
)
@click.option(
    "--template", default=None, help="Template to use for the source check (its hash must match)."
)
@click.option(
    "--model",
    default="tiny",
    show_default=True,
    help="'tiny' (random Llama, CPU), a local model folder, or 'none'.",
)
@click.option(
    "--model-rows", type=int, default=8, show_default=True, help="Rows the model check samples."
)
@click.option(
    "--sample",
    type=int,
    default=None,
    help="Compare a random sample of K records in the source check.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for sampling.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    help="Write the full report with the seam table.",
)
def verify(
    out: str,
    source: bool | None,
    source_root: str | None,
    tokenizer: str | None,
    template: str | None,
    model: str,
    model_rows: int,
    sample: int | None,
    seed: int,
    json_path: str | None,
) -> None:
    """Audit a packed folder: integrity, structure, source, model equivalence and its control.

    Exit 0 when every check holds, 1 on any finding, 2 for usage or unreadable input.

    \b
    Example:
      packshard verify packed/ --json audit.json
    """
    from packshard.cli.tables import render_verify_summary
    from packshard.verify.run import VerifyOptions, verify_dataset, write_report_json

    options = VerifyOptions(
        source=source,
        source_root=source_root,
        tokenizer=tokenizer,
        template=template,
        model=model,
        model_rows=model_rows,
        sample=sample,
        seed=seed,
    )
    report = verify_dataset(out, options)
    _console().print(render_verify_summary(report), soft_wrap=True)  # findings stay one line each
    if json_path:
        write_report_json(report, json_path)
        click.echo(f"wrote {json_path}")
    if not report.ok:
        sys.exit(EXIT_DATA)


@main.command()
@click.argument("out", type=click.Path())
@click.option("--row", type=int, default=0, show_default=True, help="Row within the shard.")
@click.option("--shard", type=int, default=0, show_default=True, help="Shard index (0-based).")
@click.option(
    "--tokenizer", default=None, help="Tokenizer to decode with (default: the recorded one)."
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    help="Also write the view as an HTML page.",
)
def inspect(out: str, row: int, shard: int, tokenizer: str | None, html_path: str | None) -> None:
    """Show one packed row: decoded segments, seams, trained tokens, positions, sources.

    \b
    Example:
      packshard inspect packed/ --row 3 --html row3.html
    """
    from packshard.cli.inspect import inspect_row, render_row_console, write_row_html

    view = inspect_row(Path(out), row=row, shard=shard, tokenizer=tokenizer)
    _console().print(render_row_console(view))
    if html_path:
        write_row_html(view, html_path)
        click.echo(f"wrote {html_path}")
