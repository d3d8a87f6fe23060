"""Command line interface: a thin click layer over the library API.

Every command turns :class:`~packshard.errors.PackshardError` into a one-line message on
stderr and its exit code (1 data or audit failure, 2 usage) in one place,
:class:`~packshard.cli.errors.CommandGroup`; an :class:`OSError` the environment raises (disk
full, permissions) becomes one line and exit 2 there too.  The choices each option offers are
the vocabularies of :mod:`packshard.options` (:mod:`packshard.cli.options`).  Terminal output
uses rich (:mod:`packshard.cli.tables`); ``--json`` and ``--html`` options write
machine-readable results and pages (:mod:`packshard.cli.html`).

Each command imports what it needs when it runs (``--help`` imports none of it), then freezes
the objects that exist (:func:`gc.freeze`) until it ends: modules, numba's registries and
the like live as long as the process, and every full collection would walk them again
(``docs/performance.md``, "Frozen imports").  A caller that runs commands in its own process
(``main([...])``, tests) gets them unfrozen when the command ends; the ``packshard`` process
itself ends with the command, and unfreezing there would cost a full walk at exit.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Any

import click

from packshard.cli.errors import CommandGroup, naming, not_over, warn
from packshard.cli.options import EXPORT, INSPECT, PACK, PROFILE, REPACK, VERIFY
from packshard.cli.sections import SectionedCommand
from packshard.errors import EXIT_DATA, EXIT_USAGE
from packshard.jit import skip_if_own


def _settled() -> None:
    """Keep full collections off what exists now (the imported modules) until the command ends."""
    gc.freeze()
    skip_if_own(imported=True)  # no other package's numba extensions (packshard.jit)
    if not main.owns_process:  # several commands in one process: collect as before after it
        click.get_current_context().call_on_close(gc.unfreeze)


def _show_progress(progress: bool | None) -> bool:
    return sys.stderr.isatty() if progress is None else progress


def _progress_mode(progress: bool | None, quiet: bool) -> str:
    """``pack`` and ``profile``: the bar on a terminal, plain lines in a log, none if quiet."""
    from packshard.ingest import progress_mode

    return "off" if quiet else progress_mode(progress)


@click.group(cls=CommandGroup, context_settings={"show_default": True})
@click.version_option(package_name="packshard")
def main() -> None:
    """Pack chat fine-tuning data into audited, seam-safe Parquet shards.

    \b
    Example:
      packshard profile data/*.jsonl -t tok/ --max-seq-len 4096
      packshard pack data/*.jsonl -t tok/ --max-seq-len 4096 -o packed/
      packshard repack packed/ --max-seq-len 8192 -o packed-8k/
      packshard verify packed/
      packshard export packed/ --to megatron -o megatron/
    """


@main.command()
@click.argument("data", nargs=-1, required=True)
@PROFILE
def profile(
    data: tuple[str, ...],
    progress: bool | None,
    json_path: str | None,
    html_path: str | None,
    max_reject_rate: float | None = None,
    allow_split_markers: bool = False,
    quiet: bool = False,
    **options: Any,
) -> None:
    """Length quantiles per domain and the padding waste packing would remove.

    \b
    Example:
      packshard profile chat.jsonl code.jsonl -t tokenizer/ --max-seq-len 4096 --html profile.html
    """
    from packshard.cli.html import write_profile_html
    from packshard.cli.rejectrate import check_max_reject_rate, enforce_reject_rate
    from packshard.cli.tables import console, render_profile_table, render_rejects
    from packshard.ingest import expand_inputs, open_stage
    from packshard.profile import ProfileConfig, profile_inputs, report_to_dict
    from packshard.store import is_url

    _settled()

    config = ProfileConfig.build(inputs=data, **options)
    config.check()
    check_max_reject_rate(max_reject_rate)
    files = expand_inputs(data)
    not_over(json_path, html_path, reading=[f.real for f in files])
    stage = open_stage(config.tokenizer, config.template, config.ingest, allow_split_markers)
    report = profile_inputs(files, config, _progress_mode(progress, quiet), stage)
    if note := stage.backend_note():
        warn(note)
    screen = console(quiet)
    screen.print(render_profile_table(report))
    screen.print(render_rejects(report))
    if json_path:
        text = json.dumps(report_to_dict(report), indent=2, sort_keys=True, ensure_ascii=False)
        with naming(json_path):
            Path(json_path).write_text(text + "\n", encoding="utf-8")
        if not quiet:
            click.echo(f"wrote {json_path}")
    if html_path:
        with naming(html_path):
            write_profile_html(report, html_path)
        if not quiet:
            click.echo(f"wrote {html_path}")
    codes = dict(report.reject_codes)
    sources = [f.path if is_url(f.path) else str(f.real) for f in files]  # a URL as given
    enforce_reject_rate(report.total.records, codes, max_reject_rate, config.ingest.format, sources)


@main.command(cls=SectionedCommand)
@click.argument("data", nargs=-1, required=True)
@PACK
def pack(
    data: tuple[str, ...],
    fmt: str,
    progress: bool | None,
    max_reject_rate: float | None,
    quiet: bool = False,
    **options: Any,
) -> None:
    """Tokenize, pack and write Parquet shards with an examples index, rejects and a manifest.

    \b
    Example:
      packshard pack chat.jsonl -t tokenizer/ --max-seq-len 4096 -o packed/ --overlong split
    """
    from packshard.cli.rejectrate import check_max_reject_rate, enforce_reject_rate
    from packshard.pack.config import PackConfig
    from packshard.pack.units.early import start_early

    check_max_reject_rate(max_reject_rate)
    config = PackConfig.build(inputs=data, format=fmt, **options)
    listed = start_early(config)  # the workers' imports and warm-up beside this process's own
    from packshard.cli.tables import console, render_mixture, render_pack_summary
    from packshard.pack.pipeline import pack_dataset

    _settled()

    with naming(config.out):
        mode = _progress_mode(progress, quiet)
        result = pack_dataset(config, progress=mode, notify=warn, inputs=listed)
    for warning in result.warnings:
        warn(warning)
    screen = console(quiet)
    screen.print(render_pack_summary(result))
    stats = result.manifest["stats"]
    if "mix" in stats:
        screen.print(render_mixture(stats["mix"], "Mixture before (input) and after (packed)"))
    sources = [i["resolved"] for i in result.manifest["inputs"]]
    enforce_reject_rate(stats["records"], stats["rejects_by_code"], max_reject_rate, fmt, sources)


@main.command()
@click.argument("parent", type=click.Path())
@REPACK
def repack(parent: str, out: str, overwrite: bool, **changes: Any) -> None:
    """Re-plan a packed folder for another length, seed or strategy, without re-tokenizing.

    Reads only PARENT's shards and index (no tokenizer, template or input file) and writes
    the folder a fresh pack with the same options would: the same shards and examples index,
    byte for byte; its manifest names PARENT.  Options left out keep PARENT's.

    \b
    Example:
      packshard repack packed/ --max-seq-len 8192 --seed 1 -o packed-8k/
    """
    from packshard.cli.tables import console, render_pack_summary
    from packshard.repack import RepackConfig, repack_dataset

    _settled()

    config = RepackConfig.build(parent, out, overwrite, **changes)
    with naming(out):
        result = repack_dataset(config, notify=warn)
    for warning in result.warnings:
        warn(warning)
    console().print(render_pack_summary(result))


@main.command()
@click.argument("out", type=click.Path())
@VERIFY
def verify(out: str, json_path: str | None, progress: bool | None, **options: Any) -> None:
    """Audit a packed folder: integrity, structure, source, model equivalence and its control.

    Exit 0 when every check holds, 1 on any finding, 2 for usage, unreadable input or a check
    that could not run (install what it names, or opt out with --no-source / --model none).

    \b
    Example:
      packshard verify packed/ --json audit.json
    """
    from packshard.cli.tables import console, render_verify_summary
    from packshard.verify.run import VerifyOptions, verify_dataset, write_report_json

    _settled()

    not_over(json_path, reading=[Path(out)])
    report = verify_dataset(out, VerifyOptions(progress=_show_progress(progress), **options))
    console().print(render_verify_summary(report), soft_wrap=True)  # findings stay one line each
    if json_path:
        with naming(json_path):
            write_report_json(report, json_path)
        click.echo(f"wrote {json_path}")
    if len(report.findings):
        sys.exit(EXIT_DATA)
    if report.not_run:  # nothing failed, but the user must install an extra or opt out
        sys.exit(EXIT_USAGE)


@main.command()
@click.argument("out", type=click.Path())
@INSPECT
def inspect(out: str, row: int, shard: int, tokenizer: str | None, html_path: str | None) -> None:
    """Show one packed row: decoded segments, seams, trained tokens, positions, sources.

    \b
    Example:
      packshard inspect packed/ --row 3 --html row3.html
    """
    from packshard.cli.html import write_row_html
    from packshard.cli.inspect import inspect_row, render_row_console
    from packshard.cli.tables import console, plain

    _settled()

    not_over(html_path, reading=[Path(out)])
    view = inspect_row(Path(out), row=row, shard=shard, tokenizer=tokenizer)
    console().print(render_row_console(view, marked=plain()))
    if html_path:
        with naming(html_path):
            write_row_html(view, html_path)
        click.echo(f"wrote {html_path}")


@main.command()
@click.argument("out", type=click.Path())
@EXPORT
def export(out: str, target: str, dest: str, overwrite: bool) -> None:
    """Convert a packed folder for Megatron-Bridge, torchtune, MosaicML streaming or Axolotl.

    Every shard is checked against the manifest while it is read; the folder is written
    atomically, export.json (source, counts, every file's SHA-256) last.

    \b
    Example:
      packshard export packed/ --to megatron -o megatron/
    """
    from packshard.engine import terminating
    from packshard.export import export_dataset

    _settled()

    with terminating():  # SIGTERM unwinds as Ctrl-C: the partial folder and the lock go
        result = export_dataset(out, target, dest, overwrite, notify=warn)
    written = result.info["written"]
    counts = ", ".join(f"{k} {v:,}" for k, v in written.items() if isinstance(v, int))
    click.echo(f"exported {out} → {result.dest} ({target}): {counts}")
    for name, sha in result.info["files"].items():
        click.echo(f"  {name}  {(result.dest / name).stat().st_size:,} bytes  sha256 {sha[:16]}…")
    click.echo("  export.json  (source, counts and these checksums)")
    if target == "torchtune":
        from packshard.export.pins import torchtune_problem

        if problem := torchtune_problem():
            warn(problem)
