"""``pack``: the whole job, from input files to an audited output folder.

Stages, each its own module::

    expand_inputs ─► ingest (read, normalize, render, tokenize) ─► SpillWriter (overlong policy)
      ─► plan_packs (lengths only) ─► drop target-less parts ─► shuffle rows (seed)
      ─► assemble_rows + write_shard, one shard at a time ─► examples index, rejects, manifest

Memory holds the per-example integers and one row group of a shard; tokens wait on disk in
the spill.

Atomicity: everything is written into ``.NAME.partial-PID`` beside ``OUT``; the manifest is
written last; the folder is renamed to ``OUT`` only when complete.  An interrupted run leaves
at most a ``.partial`` folder with no manifest, never an ``OUT`` that looks complete.

Determinism: the same inputs and options give byte-identical shards and examples index; only
the manifest's ``created_at`` differs.  Example ids number the packed examples in input order
(record order, then part).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packshard import __version__
from packshard.errors import UsageError
from packshard.ingest.chunks import IngestOptions, ingest, ingest_label_path
from packshard.format.manifest import (
    EXAMPLES_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    REJECTS_NAME,
    SHARD_PATTERN,
    compute_dataset_id,
    sha256_path,
    write_json_atomic,
)
from packshard.pack.planner import plan_packs
from packshard.pack.rows import RowPlan, finalize_plan, ordering_stats
from packshard.format.shards import ROW_GROUP_ROWS, ShardInfo, assemble_rows, write_shard
from packshard.ingest.sources import InputFile, expand_inputs
from packshard.pack.spill import OVERLONG_POLICIES, Spill, SpillWriter
from packshard.pack.counts import StatsCollector
from packshard.ingest.templates import load_template
from packshard.ingest.tokenizer import load_tokenizer

STRATEGIES = ("bfd", "ffd", "wrapped")
COMPRESSIONS = ("zstd", "snappy", "none")
BYTES_PER_TOKEN_ESTIMATE = 2.5


@dataclass(frozen=True, slots=True)
class PackConfig:
    """Everything ``pack`` needs; the recorded part goes into the manifest's ``config``."""

    inputs: tuple[str, ...]
    tokenizer: str
    out: str
    max_seq_len: int
    template: str | None = None
    strategy: str = "bfd"
    overlong: str = "drop"
    loss: str = "auto"
    seed: int = 0
    group_by_domain: bool = False
    format: str = "auto"
    domain_field: str = "domain"
    on_error: str = "skip"
    shard_rows: int = 8192
    shard_bytes: int = 256 * 1024 * 1024
    compression: str = "zstd"
    overwrite: bool = False
    num_workers: int | None = None
    batch_size: int = 1024

    def recorded(self) -> dict[str, Any]:
        """Return the manifest's ``config`` block (what determines the output's content)."""
        return {
            "max_seq_len": self.max_seq_len,
            "strategy": self.strategy,
            "overlong": "split" if self.strategy == "wrapped" else self.overlong,
            "loss": self.loss,
            "position_ids": "reset",
            "seed": self.seed,
            "group_by_domain": self.group_by_domain,
            "format": self.format,
            "domain_field": self.domain_field,
            "compression": self.compression,
            "shard_rows": self.shard_rows,
            "shard_bytes": self.shard_bytes,
        }


@dataclass(frozen=True)
class PackResult:
    """What ``pack`` produced: the folder and its manifest."""

    out: Path
    manifest: dict[str, Any]
    seconds: float
    warnings: tuple[str, ...] = field(default=())


def check_config(config: PackConfig) -> list[str]:
    """Refuse impossible options up front; return warnings for questionable ones."""
    if config.max_seq_len < 2:
        raise UsageError(f"--max-seq-len {config.max_seq_len} is too small (need at least 2)")
    for name, value, allowed in (
        ("--strategy", config.strategy, STRATEGIES),
        ("--overlong", config.overlong, OVERLONG_POLICIES),
        ("--compression", config.compression, COMPRESSIONS),
        ("--on-error", config.on_error, ("skip", "fail")),
    ):
        if value not in allowed:
            raise UsageError(f"{name} {value!r} is not one of {', '.join(allowed)}")
    if config.shard_rows < 1 or config.shard_bytes < 1:
        raise UsageError("--shard-rows and --shard-bytes must be positive")
    out = Path(config.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not config.overwrite:
        raise UsageError(f"{out}: output folder exists and is not empty (use --overwrite)")
    warnings: list[str] = []
    if config.strategy == "wrapped" and config.overlong not in ("drop", "split"):
        warnings.append(
            f"--strategy wrapped splits every example at row ends; --overlong {config.overlong} "
            "does not apply (the manifest records overlong=split)"
        )
    split_like = config.overlong == "split" or config.strategy == "wrapped"
    if split_like and config.loss in ("auto", "assistant", "last_assistant"):
        warnings.append(
            "splitting chat examples: parts after the first lose their prompt (their targets "
            "are trained without the conversation that led to them)"
        )
    return warnings


def pack_dataset(config: PackConfig, progress: bool = False) -> PackResult:
    """Run the whole ``pack`` job and return the written folder and manifest."""
    started = time.perf_counter()
    warnings = check_config(config)
    if config.num_workers:
        os.environ["RAYON_NUM_THREADS"] = str(config.num_workers)
    files = expand_inputs(config.inputs)
    bundle = load_tokenizer(config.tokenizer)
    template = load_template(config.template, bundle)
    out = Path(config.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        manifest = _pack_into(tmp, config, files, bundle, template, progress)
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PackResult(out, manifest, time.perf_counter() - started, tuple(warnings))


def _pack_into(
    tmp: Path,
    config: PackConfig,
    files: Sequence[InputFile],
    bundle: Any,
    template: Any,
    progress: bool,
) -> dict[str, Any]:
    options = IngestOptions(
        format=config.format,
        domain_field=config.domain_field,
        loss=config.loss,
        on_error=config.on_error,
        batch_size=config.batch_size,
    )
    spill_dir = tmp / "_spill"
    spill_dir.mkdir()
    writer = SpillWriter(
        spill_dir, config.max_seq_len, config.overlong, split_at_rows=config.strategy == "wrapped"
    )
    stats = StatsCollector([f.path for f in files])
    record_base = 0
    with open(tmp / REJECTS_NAME, "w", encoding="utf-8") as rejects_fh:
        for chunk in ingest(files, bundle, template, options, progress=progress):
            batch = chunk.batch
            n = len(batch)
            source_index = stats.source_codes(batch.refs)
            domain_codes = stats.domain_codes(batch.domains)
            stats.add_ingest(chunk, domain_codes)
            dropped = writer.add(
                batch, source_index, domain_codes, np.arange(record_base, record_base + n)
            )
            record_base += n
            stats.add_rejects(chunk.rejects, dropped)
            for reject in (*chunk.rejects, *dropped):
                rejects_fh.write(reject.to_json() + "\n")
        spill = writer.finish()
        plan = _plan(spill, config)
        dropped = stats.drop_wrapped_records(spill, plan)
        for reject in dropped:
            rejects_fh.write(reject.to_json() + "\n")
    ordering = ordering_stats(plan)
    rng = np.random.default_rng(config.seed)
    plan = plan.permute_rows(rng.permutation(plan.num_rows))
    fingerprints = {
        "format_version": FORMAT_VERSION,
        "inputs": [sha256_path(f.real) for f in files],
        "tokenizer": bundle.sha256,
        "template": template.sha256 if template is not None else None,
    }
    dataset_id = compute_dataset_id(config.recorded(), fingerprints)
    shards = _write_shards(tmp, spill, plan, config, dataset_id)
    examples_table = stats.examples_table(spill, plan, shards)
    pq.write_table(examples_table, tmp / EXAMPLES_NAME, compression="zstd")
    manifest = {
        "format_version": FORMAT_VERSION,
        "packshard_version": __version__,
        "dataset_id": dataset_id,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": config.recorded(),
        "tokenizer": {
            "path": bundle.path,
            "sha256": bundle.sha256,
            "vocab_size": bundle.vocab_size,
            "bos_token_id": bundle.bos_token_id,
            "eos_token_id": bundle.eos_token_id,
            "pad_token_id": bundle.pad_token_id,
        },
        "template": _template_entry(template, config.loss),
        "inputs": [
            {"path": f.path, "sha256": sha, "records": stats.records_per_input[i]}
            for i, (f, sha) in enumerate(zip(files, fingerprints["inputs"], strict=True))
        ],
        "stats": stats.summary(
            spill,
            plan,
            config.max_seq_len,
            ordering,
            {
                "tokens_truncated": writer.tokens_truncated,
                "parts_dropped": writer.parts_dropped + plan.parts_dropped,
            },
        ),
        "files": {
            "examples": {"path": EXAMPLES_NAME, "sha256": sha256_path(tmp / EXAMPLES_NAME)},
            "rejects": {"path": REJECTS_NAME, "sha256": sha256_path(tmp / REJECTS_NAME)},
        },
        "shards": [s.to_dict() for s in shards],
    }
    del spill
    shutil.rmtree(spill_dir)
    write_json_atomic(tmp / MANIFEST_NAME, manifest)
    return manifest


def _template_entry(template: Any, loss: str) -> dict[str, Any]:
    if template is None:
        return {"source": None, "sha256": None, "label_spans": "none"}
    label_spans = ingest_label_path(template, loss)
    return {"source": template.source, "sha256": template.sha256, "label_spans": label_spans}


def _plan(spill: Spill, config: PackConfig) -> RowPlan:
    lengths = spill.lengths
    if not config.group_by_domain:
        raw = plan_packs(lengths, config.max_seq_len, config.strategy)
        return finalize_plan(spill, raw, np.arange(len(lengths)), config.strategy)
    plans = []
    for code in np.unique(spill.domain_codes):
        index = np.flatnonzero(spill.domain_codes == code)
        raw = plan_packs(lengths[index], config.max_seq_len, config.strategy)
        plans.append(finalize_plan(spill, raw, index, config.strategy))
    return RowPlan.concatenate(plans)


def _write_shards(
    tmp: Path, spill: Spill, plan: RowPlan, config: PackConfig, dataset_id: str
) -> list[ShardInfo]:
    row_tokens = plan.row_tokens()
    shards: list[ShardInfo] = []
    token_budget = max(1, int(config.shard_bytes / BYTES_PER_TOKEN_ESTIMATE))

    def row_groups(lo: int, hi: int) -> Iterator[pa.Table]:
        for start in range(lo, max(hi, lo + 1), ROW_GROUP_ROWS):  # an empty plan: one table
            block = plan.rows(start, min(start + ROW_GROUP_ROWS, hi))
            yield assemble_rows(
                spill,
                block.row_offsets,
                block.seg_example,
                block.seg_start,
                block.seg_length,
                block.example_id,
            )

    row = 0
    while row < plan.num_rows or (row == 0 and not shards and plan.num_rows == 0):
        csum = np.cumsum(row_tokens[row : row + config.shard_rows])
        take = int(np.searchsorted(csum, token_budget, side="left")) + 1
        take = max(1, min(take, config.shard_rows, plan.num_rows - row)) if plan.num_rows else 0
        name = SHARD_PATTERN.format(index=len(shards))
        groups = row_groups(row, row + take)
        shards.append(write_shard(groups, tmp, name, dataset_id, config.compression))
        row += take
        if plan.num_rows == 0:
            break
    return shards


def _publish(tmp: Path, out: Path) -> None:
    """Move the finished folder into place, replacing an old one only when it is complete."""
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
