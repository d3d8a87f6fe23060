"""Option groups, and the options every command that reads inputs takes (``@INGEST``).

:func:`group` applies several click options as one decorator.  ``INGEST`` (``profile``,
``pack``): tokenizer, template and row capacity; how records are read and labelled (format,
domain, loss, reasoning and turn policies); what a bad record does; the resource limits (see
the README's "Limits and safety"); the progress bar.  Choices are the vocabularies of
:mod:`packshard.vocab`, defaults the library's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from packshard.limits import (
    MAX_DECOMPRESSED_BYTES,
    MAX_EXPANSION,
    MAX_RECORD_BYTES,
    TEMPLATE_SECONDS,
)
from packshard.vocab import (
    BACKENDS,
    EMPTY_REASONING,
    FORMAT_CHOICES,
    LOSS_POLICIES,
    ON_ERROR,
    REASONING_MARKERS,
    REASONING_POLICIES,
    TURN_POLICIES,
)


def group(*options: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Apply ``options`` in order (the first is listed first in ``--help``)."""

    def apply(func: Any) -> Any:
        for option in reversed(options):
            func = option(func)
        return func

    return apply


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
        default=None,
        help="Chat template: a .jinja file or 'chatml' (default: the tokenizer config's).",
    ),
    click.option("--max-seq-len", type=int, required=True, help="Row capacity in tokens."),
    click.option(
        "--format",
        "fmt",
        default="auto",
        show_default=True,
        type=click.Choice(FORMAT_CHOICES),
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
        type=click.Choice(LOSS_POLICIES),
        help="Which tokens are trained (auto: assistant turns, completions, all text).",
    ),
    click.option(
        "--on-error",
        default="skip",
        show_default=True,
        type=click.Choice(ON_ERROR),
        help="skip: bad records go to the rejects; fail: stop at the first (exit 1).",
    ),
    click.option(
        "--reasoning",
        default="train",
        show_default=True,
        type=click.Choice(REASONING_POLICIES),
        help="Assistant reasoning: train it, keep it untrained (mask), or remove it (drop).",
    ),
    click.option(
        "--empty-reasoning",
        default="train",
        show_default=True,
        type=click.Choice(EMPTY_REASONING),
        help="Empty reasoning blocks a template renders: train them or mask them.",
    ),
    click.option(
        "--turns",
        default="as_rendered",
        show_default=True,
        type=click.Choice(TURN_POLICIES),
        help="as_rendered: the conversation once; expand: one example per trained turn.",
    ),
    click.option(
        "--reasoning-markers",
        default=",".join(REASONING_MARKERS),
        show_default=True,
        callback=lambda ctx, param, value: _markers(value),
        help="Opening and closing marker of inline reasoning, comma-separated.",
    ),
    click.option(
        "--backend",
        default="auto",
        show_default=True,
        type=click.Choice(BACKENDS),
        help="Encoder: fast (pip install 'packshard[fast]'), reference (tokenizers), or auto "
        "(fast where a canary and the first records encode the same both ways).",
    ),
    click.option(
        "--progress/--no-progress",
        default=None,
        help="Progress bar (default: when stderr is a terminal).",
    ),
    click.option(
        "--max-record-bytes",
        type=int,
        default=MAX_RECORD_BYTES,
        show_default=True,
        help="Largest record (line, element, row) and rendered text; larger: too_large.",
    ),
    click.option(
        "--max-decompressed-bytes",
        type=int,
        default=MAX_DECOMPRESSED_BYTES,
        show_default=True,
        help="Most bytes one .gz/.zst input may decompress to (more: the run stops).",
    ),
    click.option(
        "--max-expansion",
        type=int,
        default=MAX_EXPANSION,
        show_default=True,
        help="Most decompressed/compressed ratio past 16 MiB (a bomb stops the run).",
    ),
    click.option(
        "--template-timeout",
        type=float,
        default=TEMPLATE_SECONDS,
        show_default=True,
        help="Seconds one record's render may take (more: template_error).",
    ),
)
