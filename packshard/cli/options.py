"""Every command-line option: its name, default, choices and help, grouped by command.

:func:`group` applies several click options as one decorator; each group (``@PACK``,
``@INGEST`` …) is applied by :mod:`packshard.cli.commands`.  ``INGEST`` (``profile``,
``pack``): tokenizer, template and row capacity; how records are read and labelled (format,
domain, loss, reasoning and turn policies); what a bad record does; the resource limits;
the progress bar.  Choices are the vocabularies of :mod:`packshard.options`, defaults the
library's; ``--help`` shows every default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from packshard.cli.sections import human_bytes
from packshard.engine import AUTO_BYTES, ENGINES, WORKER_MEMORY
from packshard.errors import UsageError
from packshard.format.topology import ATTENTION_C, BALANCE_COSTS
from packshard.options import (
    BACKENDS,
    COMPRESSIONS,
    EMPTY_REASONING,
    EXPORT_TARGETS,
    FORMAT_CHOICES,
    LOSS_POLICIES,
    MAX_DECOMPRESSED_BYTES,
    MAX_EXPANDED_TOKENS,
    MAX_EXPANSION,
    MAX_RECORD_BYTES,
    MIX_BY,
    NO_CAP,
    ON_ERROR,
    OVERLONG_POLICIES,
    REASONING_MARKERS,
    REASONING_POLICIES,
    STRATEGIES,
    TEMPLATE_SECONDS,
    TURN_POLICIES,
    VISION_RULES,
)


def group(*options: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Apply ``options`` in order (the first is listed first in ``--help``)."""

    def apply(func: Any) -> Any:
        for option in reversed(options):
            func = option(func)
        return func

    return apply


def _output(flag: str, dest: str, help: str) -> Callable[[Any], Any]:
    """Return the option of a file the command writes (``--json``, ``--html``) as ``dest``."""
    return click.option(flag, dest, type=click.Path(dir_okay=False), help=help)


def _seed(help: str) -> Callable[[Any], Any]:
    return click.option("--seed", type=int, default=0, help=help)


def _workers(value: str | int | None) -> int | None:
    """Parse ``--workers``: a count (the engine checks its range) or ``auto`` (None)."""
    if value is None or value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"--workers {value!r} is neither a number nor 'auto'") from None


def _markers(value: str) -> tuple[str, str]:
    """``OPEN,CLOSE`` as a pair (click turns the error into a usage error, exit 2)."""
    opening, comma, closing = value.partition(",")
    if not comma or not opening.strip() or not closing.strip():
        raise click.BadParameter(f"expected OPEN,CLOSE (e.g. '<think>,</think>'), got {value!r}")
    return opening, closing


INGEST = group(
    click.option(
        "--tokenizer",
        "-t",
        required=True,
        help="tokenizer.json, or a folder holding it with tokenizer_config.json.",
    ),
    click.option(
        "--template",
        help="Chat template: a .jinja file or 'chatml' (default: the tokenizer config's).",
    ),
    click.option(
        "--allow-split-markers",
        is_flag=True,
        help="Accept a template whose markers (<|im_start|> …) the tokenizer splits into pieces.",
    ),
    click.option("--max-seq-len", type=int, required=True, help="Row capacity in tokens."),
    click.option(
        "--format",
        "fmt",
        default="auto",
        type=click.Choice(FORMAT_CHOICES),
        help="Record format (detected per record by default).",
    ),
    click.option(
        "--domain-field",
        default="domain",
        help="Record field naming its domain (else the file name).",
    ),
    click.option(
        "--loss",
        default="auto",
        type=click.Choice(LOSS_POLICIES),
        help="Which tokens are trained (auto: assistant turns, completions, all text).",
    ),
    click.option(
        "--on-error",
        default="skip",
        type=click.Choice(ON_ERROR),
        help="skip: bad records go to the rejects; fail: stop at the first (exit 1).",
    ),
    click.option(
        "--reasoning",
        default="train",
        type=click.Choice(REASONING_POLICIES),
        help="Assistant reasoning: train it, keep it untrained (mask), or remove it (drop).",
    ),
    click.option(
        "--empty-reasoning",
        default="train",
        type=click.Choice(EMPTY_REASONING),
        help="Empty reasoning blocks a template renders: train them or mask them.",
    ),
    click.option(
        "--turns",
        default="as_rendered",
        type=click.Choice(TURN_POLICIES),
        help="as_rendered: the conversation once; expand: one example per trained turn.",
    ),
    click.option(
        "--reasoning-markers",
        default=",".join(REASONING_MARKERS),
        callback=lambda ctx, param, value: _markers(value),
        help="Opening and closing marker of inline reasoning, comma-separated.",
    ),
    click.option(
        "--media-root",
        default=None,
        show_default=False,
        help="Folder that relative image paths start from (default: each record's folder).",
    ),
    click.option(
        "--max-pixels",
        type=int,
        default=None,
        show_default=False,
        help="Largest image area after resizing, in pixels (default: the vision rule's, "
        "Qwen2-VL 28*28*1280).",
    ),
    click.option(
        "--min-pixels",
        type=int,
        default=None,
        show_default=False,
        help="Smallest image area after resizing, in pixels (default: the rule's, 56*56).",
    ),
    click.option(
        "--vision-family",
        default="qwen2_vl",
        type=click.Choice(tuple(VISION_RULES)),
        help="Whose image processor sizes images: qwen2_vl (Qwen2-VL and Qwen2.5-VL, patch 14) "
        "or qwen3_vl (patch 16, 256*256 to 4096*4096 pixels).",
    ),
    click.option(
        "--backend",
        default="auto",
        type=click.Choice(BACKENDS),
        help="Renderer and encoder: fast (minijinja; gigatoken or fastokens, the family's faster; "
        "pip install 'packshard[fast]'), "
        "reference (Jinja's sandbox, tokenizers), or auto (fast where a canary and the first "
        "records render and encode the same both ways).",
    ),
    click.option(
        "--progress/--no-progress",
        default=None,
        help="Progress on stderr: a bar on a terminal, else a plain line with counts, rate "
        "and an estimate every 10 s (default: on).",
    ),
    click.option(
        "--quiet",
        "-q",
        is_flag=True,
        help="Print only warnings and errors: no progress, no summary.",
    ),
    click.option(
        "--max-record-bytes",
        type=int,
        default=MAX_RECORD_BYTES,
        show_default=False,
        help="Largest record (line, element, row) and rendered text; larger: too_large.  "
        f"[default: {human_bytes(MAX_RECORD_BYTES)}]",
    ),
    click.option(
        "--max-decompressed-bytes",
        type=int,
        default=MAX_DECOMPRESSED_BYTES,
        show_default=False,
        help="Most bytes one .gz/.zst input may decompress to (more: the run stops).  "
        f"[default: {human_bytes(MAX_DECOMPRESSED_BYTES)}]",
    ),
    click.option(
        "--max-expansion",
        type=int,
        default=MAX_EXPANSION,
        help="Most decompressed/compressed ratio past 16 MiB (a bomb stops the run).",
    ),
    click.option(
        "--max-expanded-tokens",
        type=int,
        default=MAX_EXPANDED_TOKENS,
        help="Most tokens one record's --turns expand examples may hold together.",
    ),
    click.option(
        "--template-timeout",
        type=float,
        default=TEMPLATE_SECONDS,
        help="Seconds one record's render may take (more: template_error).",
    ),
)


ENGINE = group(
    click.option(
        "--engine",
        default="local",
        type=click.Choice(ENGINES),
        help="local: processes on this machine; ray: a Ray cluster (pip install 'packshard[ray]').",
    ),
    click.option(
        "--workers",
        default="auto",
        callback=lambda _ctx, _param, value: _workers(value),
        help="Worker processes (local), or CPUs of the Ray cluster started for the job; "
        f"auto: one per {human_bytes(AUTO_BYTES)} of input, at most one per core and one per "
        f"{human_bytes(WORKER_MEMORY)} of available memory.",
    ),
    click.option("--ray-address", help="Join this Ray cluster (default: start a local one)."),
)
UNITS = click.option(
    "--split-bytes",
    type=int,
    default=0,
    show_default=False,
    help="Work unit size: JSONL is cut at line starts, Parquet at row groups "
    "(default: the inputs' bytes over 64, within 16–64 MiB).",
)

MAX_REJECT_RATE = click.option(
    "--max-reject-rate",
    type=float,
    help="Exit 1 when more than this share (0–1) of the records is rejected as bad input "
    "(default: 0.5, and a warning above 0.1; 1 never fails).",
)


MIX = group(
    click.option(
        "--mix",
        default="",
        show_default=False,
        metavar="DOMAIN=SHARE,…",
        help="Target share of each domain in the output (shares add up to 1): domains over "
        "their share are subsampled, those under it repeated (seeded, by --seed).",
    ),
    click.option(
        "--mix-by",
        default="trained_tokens",
        type=click.Choice(MIX_BY),
        help="What --mix shares count.",
    ),
    click.option(
        "--max-repeat",
        type=int,
        default=1,
        help="Most copies of a record --mix may pack (1: none repeated).",
    ),
    click.option(
        "--mix-best-effort",
        is_flag=True,
        help="When --max-repeat makes a --mix share unreachable, keep the shares in a smaller "
        "mixture instead of stopping.",
    ),
)
"""``--mix`` and its options: pack makes the mixture, profile predicts it."""

OVERLONG = click.option(
    "--overlong",
    default="drop",
    type=click.Choice(OVERLONG_POLICIES),
    help="What to do with examples longer than --max-seq-len (profile: what it says pack does).",
)

PROFILE = group(
    INGEST,
    OVERLONG,
    MAX_REJECT_RATE,
    ENGINE,
    UNITS,
    click.option(
        "--batch-size",
        type=int,
        default=8,
        help="Training batch size assumed by the padding estimates.",
    ),
    _seed("Seed of the random-batch estimate (and of the --mix prediction, as pack's)."),
    MIX,
    _output("--json", "json_path", "Write the report as JSON."),
    _output("--html", "html_path", "Write an HTML page with histograms and charts."),
)


def _topology(keep_parent: bool) -> Callable[[Any], Any]:
    """Return the alignment and balanced-step options; ``keep_parent``: no defaults (repack)."""

    def default(value: Any) -> Any:
        return None if keep_parent else value

    return group(
        click.option(
            "--cp",
            type=int,
            default=default(1),
            help="Context-parallel size: pad every segment to a multiple of 2*CP "
            "(cu_seqlens_padded beside cu_seqlens; pads never trained).",
        ),
        click.option(
            "--tp",
            type=int,
            default=default(1),
            help="Tensor-parallel size, with sequence parallelism on: the multiple becomes "
            "lcm(2*CP, CP*TP), Megatron-Bridge's rule.",
        ),
        click.option(
            "--pad-multiple",
            type=int,
            default=default(1),
            help="Pad every segment to a multiple of N (combined with --cp/--tp by lcm).",
        ),
        click.option(
            "--dp",
            type=int,
            default=default(0),
            help="Data-parallel size: order the train rows into global steps whose slowest "
            "rank costs close to the mean (0: the seed's order).",
        ),
        click.option(
            "--micro-batch",
            type=int,
            default=default(1),
            help="Rows per rank per forward, for --dp steps.",
        ),
        click.option(
            "--grad-accum",
            type=int,
            default=default(1),
            help="Micro-batches per optimizer step, for --dp steps.",
        ),
        click.option(
            "--balance-cost",
            type=click.Choice(BALANCE_COSTS),
            default=default("attention"),
            help="A row's cost for --dp: its tokens, or attention: sum n + c * sum n^2 over "
            "its segments' lengths n.",
        ),
        click.option(
            "--attention-c",
            type=float,
            default=default(ATTENTION_C),
            show_default=False,
            help="c of the attention cost: 1/(12*hidden_size) of your model.  "
            "[default: 1/(12*4096)]",
        ),
    )


PACK = group(
    INGEST,
    click.option(
        "-o",
        "--out",
        required=True,
        help="Output folder (written atomically), or s3://BUCKET/PREFIX (the manifest "
        "published last, one writer at a time; docs/object-stores.md).",
    ),
    MAX_REJECT_RATE,
    click.option(
        "--strategy",
        default="bfd",
        type=click.Choice(STRATEGIES),
        help="bfd/ffd: best/first-fit decreasing; sequential: next-fit in input order, rows not "
        "shuffled (curricula, ordered data); wrapped: a token stream cut into full rows.",
    ),
    OVERLONG,
    _seed("Seed of the row shuffle (and of the --eval-fraction and --mix draws)."),
    click.option(
        "--eval-fraction",
        type=float,
        default=0.0,
        help="Share of the records drawn (seeded, by record) into the eval split.",
    ),
    click.option(
        "--eval",
        "eval_inputs",
        multiple=True,
        metavar="FILE",
        help="An input whose records all go to the eval split (repeatable).",
    ),
    click.option("--group-by-domain", is_flag=True, help="Rows hold examples of one domain each."),
    MIX,
    click.option(
        "--max-images-per-row",
        type=int,
        default=NO_CAP,
        help="Most images a row holds (0: no cap); an example with more alone is dropped.",
    ),
    click.option(
        "--max-vision-tokens-per-row",
        type=int,
        default=NO_CAP,
        help="Most vision (image placeholder) tokens a row holds (0: no cap); an example with "
        "more alone is dropped.",
    ),
    click.option("--shard-rows", type=int, default=8192, help="Most rows per shard."),
    click.option(
        "--shard-bytes",
        type=int,
        default=256 * 1024 * 1024,
        show_default=False,
        help=f"Approximate most bytes per shard.  [default: {human_bytes(256 << 20)}]",
    ),
    click.option(
        "--compression",
        default="zstd",
        type=click.Choice(COMPRESSIONS),
        help="Parquet compression of the shards.",
    ),
    click.option(
        "--overwrite",
        is_flag=True,
        help="Replace a non-empty output folder (only once the new one is complete).",
    ),
    click.option(
        "--num-workers",
        type=int,
        help="Tokenizer threads in each process (default: all cores; --workers: processes).",
    ),
    ENGINE,
    UNITS,
    click.option(
        "--plan-scope",
        default="global",
        help="Plan all examples at once, or group:N (N consecutive examples at a time).",
    ),
    click.option(
        "--resume", is_flag=True, help="Keep the finished work units of an interrupted run."
    ),
    _topology(keep_parent=False),
)

REPACK = group(
    click.option(
        "-o",
        "--out",
        required=True,
        help="Output folder (written atomically; never the parent).",
    ),
    click.option("--max-seq-len", type=int, help="Row capacity in tokens."),
    click.option(
        "--strategy",
        type=click.Choice(STRATEGIES),
        help="bfd/ffd: best/first-fit decreasing; sequential: next-fit in input order; "
        "wrapped: a token stream cut into full rows.",
    ),
    click.option(
        "--overlong",
        type=click.Choice(OVERLONG_POLICIES),
        help="What to do with examples longer than the new --max-seq-len.",
    ),
    click.option("--seed", type=int, help="Seed of the row shuffle and the --eval-fraction draw."),
    click.option(
        "--eval-fraction",
        type=float,
        help="Share of the records drawn (seeded, by record) into the eval split.",
    ),
    click.option(
        "--group-by-domain/--no-group-by-domain",
        default=None,
        help="Rows hold examples of one domain each.",
    ),
    click.option("--plan-scope", help="Plan all examples at once (global), or group:N."),
    click.option("--shard-rows", type=int, help="Most rows per shard."),
    click.option("--shard-bytes", type=int, help="Approximate most bytes per shard."),
    click.option(
        "--compression", type=click.Choice(COMPRESSIONS), help="Parquet compression of the shards."
    ),
    click.option(
        "--overwrite",
        is_flag=True,
        help="Replace a non-empty output folder (only once the new one is complete).",
    ),
    _topology(keep_parent=True),
)
"""``repack``'s options: each left out keeps the parent's setting (its manifest's config)."""

VERIFY = group(
    ENGINE,
    click.option(
        "--source/--no-source",
        default=None,
        help="Re-ingest the inputs and compare (default: when they are found).",
    ),
    click.option(
        "--source-root",
        type=click.Path(file_okay=False),
        help="Folder to find the recorded inputs, tokenizer and template in by name.",
    ),
    click.option(
        "--tokenizer",
        help="Tokenizer to use for the source check (its hash must match).",
    ),
    click.option(
        "--template",
        help="Template to use for the source check (its hash must match).",
    ),
    click.option(
        "--model",
        default="tiny",
        help="'tiny' (random Llama, CPU), a local model folder, or 'none'.",
    ),
    click.option(
        "--model-config",
        type=click.Path(exists=True),
        help="A model's config.json (any architecture transformers ships): the check runs "
        "that architecture shrunk to a few random layers, fed as a trainer feeds it, and "
        "names the layer that first leaks.",
    ),
    click.option("--model-rows", type=int, default=8, help="Rows the model check samples."),
    click.option(
        "--sample",
        type=int,
        help="Compare a random sample of K records in the source check.",
    ),
    _seed("Seed for sampling."),
    _output("--json", "json_path", "Write the full report with the seam table."),
    click.option(
        "--progress/--no-progress",
        default=None,
        help="A line per check as it starts and ends (default: when stderr is a terminal).",
    ),
)

INSPECT = group(
    click.option("--row", type=int, default=0, help="Row within the shard."),
    click.option("--shard", type=int, default=0, help="Shard index (0-based)."),
    click.option("--tokenizer", help="Tokenizer to decode with (default: the recorded one)."),
    _output("--html", "html_path", "Also write the view as an HTML page."),
)

EXPORT = group(
    click.option(
        "--to",
        "target",
        required=True,
        type=click.Choice(EXPORT_TARGETS),
        help="Target format: Megatron-Bridge's packed Parquet, read by releases 0.4.0 onward "
        "(megatron; megatron-parquet is its earlier name), the .npy of releases up to 0.3.1 "
        "(megatron-npy), torchtune packed samples, MosaicML MDS, or one row per example "
        "(Axolotl, LitGPT).",
    ),
    click.option(
        "-o",
        "--out",
        "dest",
        required=True,
        type=click.Path(file_okay=False),
        help="Folder to write (atomically).",
    ),
    click.option(
        "--overwrite",
        is_flag=True,
        help="Replace a non-empty folder (only once the new one is complete).",
    ),
)
