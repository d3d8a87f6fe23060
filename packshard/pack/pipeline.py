"""``pack``: the whole job, from input files to an audited output folder.

Stages, each its own module, in this order::

    expand_inputs ─► ingest (read, normalize, render, tokenize, label)
      ─► SpillWriter (overlong policy) ─► plan_packs (lengths only) ─► finalize_plan
      ─► shuffle rows (seed) ─► assemble_rows + write_shard, one row group at a time
      ─► examples index, rejects, stats ─► manifest (last)

Memory holds the per-example integers and two row groups of a shard; tokens wait on disk in
the spill.  Each stage returns a typed value (the spill with what it accepted, the rejects
file's tally, the plan, the shards' entries) and :func:`pack_stats` combines them once.

Atomicity: everything is written into ``.NAME.partial-PID`` beside ``OUT``; the manifest is
written last; the folder is renamed to ``OUT`` only when complete.  An interrupted run leaves
at most a ``.partial`` folder with no manifest, never an ``OUT`` that looks complete.  What
may be replaced, the lock on ``OUT`` and the temporary names are :mod:`packshard.pack.outdir`'s.
A run that packs nothing (every record rejected or dropped) fails and writes no ``OUT``.

Determinism: the same inputs and options give byte-identical shards and examples index; only
the manifest's ``created_at`` differs.  Example ids number the packed examples in input order
(record order, then part).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packshard.digests import sha256_path
from packshard.errors import REJECTED, NothingToPackError
from packshard.format.examples import EXAMPLES_NAME, build_examples_table, write_examples
from packshard.format.manifest import build_manifest, compute_dataset_id, write_manifest
from packshard.format.rejects import REJECTS_NAME, RejectsWriter, RejectTally
from packshard.format.shards import ROW_GROUP_ROWS, SHARD_PATTERN, ShardInfo, write_shard
from packshard.format.version import FORMAT_VERSION
from packshard.ingest.chunks import ingest
from packshard.ingest.sources import InputFile, expand_inputs
from packshard.ingest.templates import ChatTemplate, load_template
from packshard.ingest.tokenizer import TokenizerBundle, load_tokenizer
from packshard.pack.assemble import assemble_rows
from packshard.pack.config import PackConfig, check_config
from packshard.pack.counts import (
    examples_columns,
    loss_policies,
    pack_stats,
    records_per_input,
    wrapped_drops,
)
from packshard.pack.outdir import claim_out
from packshard.pack.planner import plan_packs
from packshard.pack.rows import RowPlan, finalize_plan, ordering_stats
from packshard.pack.spill import Spill, SpillWriter

BYTES_PER_TOKEN_ESTIMATE = 2.5


@dataclass(frozen=True)
class PackResult:
    """What ``pack`` produced: the folder and its manifest."""

    out: Path
    manifest: dict[str, Any]
    seconds: float
    warnings: tuple[str, ...] = field(default=())


def pack_dataset(
    config: PackConfig, progress: bool = False, notify: Callable[[str], None] | None = None
) -> PackResult:
    """Run the whole ``pack`` job and return the written folder and manifest.

    ``notify`` hears at once what was done beside OUT (leftovers of interrupted runs
    removed); without it those notes come back among the result's warnings.
    """
    started = time.perf_counter()
    warnings = check_config(config)
    if config.num_workers:
        os.environ["RAYON_NUM_THREADS"] = str(config.num_workers)
    files = expand_inputs(config.inputs)
    with claim_out(config.out, config.overwrite, config.inputs, files, notify) as claim:
        bundle = load_tokenizer(config.tokenizer)
        template = load_template(config.template, bundle)
        manifest = _pack_into(claim.tmp, config, files, bundle, template, progress)
        claim.publish()
    warnings += claim.notes
    return PackResult(claim.out, manifest, time.perf_counter() - started, tuple(warnings))


def _pack_into(
    tmp: Path,
    config: PackConfig,
    files: Sequence[InputFile],
    bundle: TokenizerBundle,
    template: ChatTemplate | None,
    progress: bool,
) -> dict[str, Any]:
    spill_dir = tmp / "_spill"
    spill_dir.mkdir()
    sources = tuple(f.path for f in files)
    writer = SpillWriter(
        spill_dir,
        config.max_seq_len,
        config.overlong,
        split_at_rows=config.strategy == "wrapped",
        sources=sources,
    )
    with RejectsWriter(tmp / REJECTS_NAME) as rejects:
        for chunk in ingest(files, bundle, template, config.ingest_options(), progress=progress):
            rejects.write(chunk.rejects)
            rejects.write(writer.add(chunk.batch))
        spill = writer.finish()
        plan = _plan(spill, config)
        rejects.write(wrapped_drops(spill, plan))
        tally = rejects.close()
    if plan.num_rows == 0:
        raise NothingToPackError(_nothing_packed(spill, tally))
    ordering = ordering_stats(plan)
    plan = plan.permute_rows(np.random.default_rng(config.seed).permutation(plan.num_rows))
    input_hashes = [sha256_path(f.real) for f in files]
    fingerprints = {
        "format_version": FORMAT_VERSION,
        "inputs": input_hashes,
        "tokenizer": bundle.sha256,
        "template": template.sha256 if template is not None else None,
    }
    dataset_id = compute_dataset_id(config.recorded(), fingerprints)
    shards = _write_shards(tmp, spill, plan, config, dataset_id)
    table = build_examples_table(
        examples_columns(spill, plan, shards),
        list(spill.counts.sources),
        list(spill.counts.domains),
    )
    write_examples(tmp / EXAMPLES_NAME, table, dataset_id)
    resolved, by_policy = loss_policies(spill, plan, config.loss)
    per_input = records_per_input(spill, tally)
    manifest = build_manifest(
        dataset_id=dataset_id,
        config=config.recorded(),
        tokenizer={**bundle.manifest_entry(), "resolved": str(Path(bundle.path).resolve())},
        template=_template_entry(template, config.loss),
        inputs=[
            {"path": f.path, "resolved": str(f.real), "sha256": sha, "records": n}
            for f, sha, n in zip(files, input_hashes, per_input, strict=True)
        ],
        stats=pack_stats(spill, plan, tally, ordering),
        files={
            "examples": {"path": EXAMPLES_NAME, "sha256": sha256_path(tmp / EXAMPLES_NAME)},
            "rejects": {"path": REJECTS_NAME, "sha256": sha256_path(tmp / REJECTS_NAME)},
        },
        shards=[s.to_dict() for s in shards],
        loss={"option": config.loss, "by_format": resolved, "examples_by_policy": by_policy},
    )
    del spill
    shutil.rmtree(spill_dir)
    write_manifest(tmp, manifest)
    return manifest


def _template_entry(template: ChatTemplate | None, loss: str) -> dict[str, Any]:
    if template is None:
        return {"source": None, "sha256": None, "label_spans": "none"}
    label_spans = "none" if loss == "all" else template.label_spans
    entry = {"source": template.source, "sha256": template.sha256, "label_spans": label_spans}
    if Path(template.source).is_file():  # a file (not builtin:NAME or the tokenizer config)
        entry["resolved"] = str(Path(template.source).resolve())
    return entry


def _nothing_packed(spill: Spill, tally: RejectTally) -> str:
    records = sum(spill.counts.records_per_source) + tally.total(REJECTED)
    codes = ", ".join(f"{code} {n}" for code, n in tally.by_code.items()) or "no records"
    return (
        f"nothing to pack: none of the {records} records read was packed ({codes}); no "
        "output was written (fix the inputs or the options, e.g. --max-seq-len, --overlong)"
    )


def _plan(spill: Spill, config: PackConfig) -> RowPlan:
    """Plan the whole spill, or each domain alone with ``--group-by-domain``."""
    lengths = spill.lengths
    if not config.group_by_domain:
        raw = plan_packs(lengths, config.max_seq_len, config.strategy)
        return finalize_plan(spill, raw, np.arange(len(lengths)))
    plans = []
    for code in np.unique(spill.domain_codes):
        index = np.flatnonzero(spill.domain_codes == code)
        raw = plan_packs(lengths[index], config.max_seq_len, config.strategy)
        plans.append(finalize_plan(spill, raw, index))
    return RowPlan.concatenate(plans)


def _write_shards(
    tmp: Path, spill: Spill, plan: RowPlan, config: PackConfig, dataset_id: str
) -> list[ShardInfo]:
    """Cut the rows into shards of at most ``shard_rows`` rows and about ``shard_bytes``."""
    row_tokens = plan.row_tokens()
    token_budget = max(1, int(config.shard_bytes / BYTES_PER_TOKEN_ESTIMATE))

    def row_groups(lo: int, hi: int) -> Iterator[pa.Table]:
        for start in range(lo, max(hi, lo + 1), ROW_GROUP_ROWS):  # an empty plan: one table
            yield assemble_rows(spill, plan.rows(start, min(start + ROW_GROUP_ROWS, hi)))

    shards: list[ShardInfo] = []
    row = 0
    while row < plan.num_rows or not shards:
        csum = np.cumsum(row_tokens[row : row + config.shard_rows])
        take = int(np.searchsorted(csum, token_budget, side="left")) + 1
        take = max(1, min(take, config.shard_rows, plan.num_rows - row)) if plan.num_rows else 0
        name = SHARD_PATTERN.format(index=len(shards))
        shards.append(
            write_shard(row_groups(row, row + take), tmp, name, dataset_id, config.compression)
        )
        row += take
    return shards
