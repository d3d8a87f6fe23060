"""``--help`` in sections by theme, and byte counts people can read.

:class:`SectionedCommand` lists ``pack``'s forty options under the headings of
:data:`PACK_SECTIONS` (an option no section names lands under "Other options")::

    Input and template:
      -t, --tokenizer TEXT   tokenizer.json, or a folder holding it …
    Packing:
      --strategy [bfd|ffd|wrapped] …

:func:`human_bytes` shows a byte default as ``256 MiB`` instead of ``268435456`` (in the
option's help, ``[default: 256 MiB]``).
"""

from __future__ import annotations

import click

PACK_SECTIONS: dict[str, tuple[str, ...]] = {
    "Input and template": (
        "tokenizer",
        "template",
        "allow_split_markers",
        "backend",
        "max_seq_len",
        "fmt",
        "domain_field",
    ),
    "Labels (what is trained)": (
        "loss",
        "reasoning",
        "empty_reasoning",
        "turns",
        "reasoning_markers",
    ),
    "Images": (
        "media_root",
        "vision_family",
        "max_pixels",
        "min_pixels",
        "max_images_per_row",
        "max_vision_tokens_per_row",
    ),
    "Bad records": ("on_error", "max_reject_rate"),
    "Packing": ("strategy", "overlong", "seed", "group_by_domain", "plan_scope"),
    "Mixture": ("mix", "mix_by", "max_repeat", "mix_best_effort"),
    "Eval split": ("eval_fraction", "eval_inputs"),
    "Topology (context parallel, balanced steps)": (
        "cp",
        "tp",
        "pad_multiple",
        "dp",
        "micro_batch",
        "grad_accum",
        "balance_cost",
        "attention_c",
    ),
    "Output": ("out", "shard_rows", "shard_bytes", "compression", "overwrite"),
    "Scale (processes, threads, work units)": (
        "engine",
        "workers",
        "ray_address",
        "num_workers",
        "split_bytes",
        "resume",
        "progress",
        "quiet",
    ),
    "Limits and safety": (
        "max_record_bytes",
        "max_decompressed_bytes",
        "max_expansion",
        "max_expanded_tokens",
        "template_timeout",
    ),
}
"""Option names (click's parameter names) per ``pack --help`` heading, in order."""


class SectionedCommand(click.Command):
    """A command whose ``--help`` lists its options under :data:`PACK_SECTIONS` headings."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Write one definition list per section, then what no section names."""
        records: dict[str, tuple[str, str]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and param.name is not None and isinstance(param, click.Option):
                records[param.name] = record
        for heading, names in PACK_SECTIONS.items():
            rows = [records.pop(name) for name in names if name in records]
            if rows:
                with formatter.section(heading):
                    formatter.write_dl(rows)
        if records:
            with formatter.section("Other options"):
                formatter.write_dl(list(records.values()))


def human_bytes(value: int) -> str:
    """``268435456`` → ``256 MiB``, ``64 << 30`` → ``64 GiB`` (exact multiples; else bytes)."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return f"{value >> shift:,} {unit}"
    return f"{value:,} bytes"
