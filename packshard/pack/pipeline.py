"""``pack``: the whole job, from input files to an audited output folder.

Stages, each its own module, in this order::

    expand_inputs ─► ingest (read, normalize, render, tokenize, label)
      ─► SpillWriter (overlong policy) ─► [--mix: copies per record, packshard.pack.plan.mix]
      ─► plan_packs (lengths only) ─► finalize_plan
      ─► shuffle rows (seed) ─► stats ─► examples index ─► assemble_ranges + write_shard
      ─► rejects ─► dataset card ─► manifest (last)

Memory holds the per-example integers, one chunk of the examples index (131,072 rows) and
two row groups of a shard; tokens wait on disk in the spill.  Source, domain, start and
turn codes are kept in their smallest integer type (:meth:`~packshard.pack.spill.Spill.compacted`),
each stage drops the columns no later stage reads
(:meth:`~packshard.pack.spill.Spill.without`, :meth:`~packshard.pack.plan.rows.RowPlan.without`):
the statistics read them all, the index its own, the shards only the token offsets and the
segments' examples, starts, lengths and ids; and the heap is trimmed between stages
(:func:`~packshard.pack.heap.trim_heap`).  Measured (``scripts/measure_driver_memory.py``:
peak RSS packing 2M one-token records minus that at 200k, over 1.8M, ``--workers 1``):
56.0-58.1 bytes an example (351 → 447-451 MiB; 118.8 before the index chunk shrank from
1,048,576 rows and the codes were compacted, 204 before the plan was int32 from the start,
318 before the arrays were compact); from 2M to 4M, 88.0 (447.0 → 614.9 MiB; the 4M peak
was 736.9 MiB before), the planner's, the statistics' and the index's per-example
temporaries, peaking close together (``docs/scale.md``).  Each stage
returns a typed value (the spill with what it accepted, the rejects file's tally, the
plan, the shards' entries) and :func:`pack_stats` combines them once.

Atomicity: everything is written into ``.NAME.partial-PID`` beside ``OUT``; the manifest is
written last; the folder is renamed to ``OUT`` only when complete.  An interrupted run leaves
at most a ``.partial`` folder with no manifest, never an ``OUT`` that looks complete.  What
may be replaced, the lock on ``OUT`` and the temporary names are
:mod:`packshard.format.folder`'s, shared with ``export``.
A run that packs nothing (every record rejected or dropped) fails and writes no ``OUT``.

Determinism: the same inputs and options give byte-identical shards and examples index; only
the manifest's ``created_at`` differs.  Example ids number the packed examples in input order
(record order, then part).

The ingest and the shard writing run as tasks on an engine (:mod:`packshard.pack.units.scale`),
whatever ``--workers``: the inputs are mapped unit by unit and merged into one spill, rejects
in (input, line) order; each shard is written by a task; every other stage is this module's,
so any engine and any worker count give the same bytes.  ``--workers 1`` runs the tasks in
this process on the driver's tokenizer and template.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from packshard.arrays import fill_rate
from packshard.digests import sha256_path
from packshard.engine import Engine, TaskFailed
from packshard.engine.faults import FAULTS_ENV, parse_faults
from packshard.errors import (
    REJECTED,
    NothingToPackError,
    PackshardError,
    UsageError,
    reject_kind,
)
from packshard.format.card import write_card
from packshard.format.causes import likely_cause
from packshard.format.environment import pack_environment
from packshard.format.examples import EXAMPLES_NAME, write_examples
from packshard.format.folder.claim import claim_out
from packshard.format.manifest import build_manifest, compute_dataset_id, write_manifest
from packshard.format.rejects import REJECTS_NAME, RejectsWriter, RejectTally
from packshard.format.version import FORMAT_VERSION
from packshard.ingest.label.reasoning import reasoning_field
from packshard.ingest.loaded import sharing
from packshard.ingest.progress import IngestProgress
from packshard.ingest.read.sources import InputFile, expand_inputs
from packshard.ingest.template.fast import render_entry
from packshard.ingest.template.render import ChatTemplate
from packshard.ingest.template.sandbox import template_conventions
from packshard.ingest.tokens.backends import backend_note, backends_entry
from packshard.pack.config import PackConfig, check_config
from packshard.pack.counts import (
    examples_tables,
    loss_policies,
    pack_stats,
    pair_stats,
    records_per_input,
    wrapped_drops,
)
from packshard.pack.heap import return_freed_memory, trim_heap
from packshard.pack.plan.evalsplit import (
    eval_examples,
    eval_files,
    plan_examples,
    row_order,
    split_stats,
    train_rows,
)
from packshard.pack.plan.mixed import example_repeats, mix_drops, mix_examples, mix_stats
from packshard.pack.plan.pairs import plan_pair_units
from packshard.pack.plan.rows import RowPlan, ordering_stats
from packshard.pack.spill import Spill
from packshard.pack.units.early import sized_engine
from packshard.pack.units.map import UnitResult
from packshard.pack.units.scale import DriverLoad, engine_for, hash_inputs, map_inputs, work_folder
from packshard.pack.write.shards import shard_entries, split_bounds, write_shards_on


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
    return_freed_memory()  # peak RSS is the live set (packshard.pack.heap)
    warnings = check_config(config)
    if config.num_workers:
        os.environ["RAYON_NUM_THREADS"] = str(config.num_workers)
    files = expand_inputs(config.inputs)
    train_files = len(files)
    files += eval_files(files, config.eval_inputs)
    config = replace(config, engine=sized_engine(config, files))  # --workers auto
    specs = config.inputs + config.eval_inputs
    reals = [(f.path, str(f.real)) for f in files]
    with claim_out(config.out, config.overwrite, specs, reals, notify) as claim:
        with engine_for(config) as engine, ThreadPoolExecutor(1) as loader:
            loaded = DriverLoad(config, loader)
            try:
                with sharing(config.tokenizer, config.template, loaded.result):
                    manifest = _pack_into(
                        claim.tmp, config, files, loaded, progress, engine, claim.note, train_files
                    )
            except TaskFailed:
                raise  # the finished units are kept for --resume
            except NothingToPackError as exc:  # no folder, but the rejects say why
                shutil.rmtree(work_folder(claim.out), ignore_errors=True)
                kept = claim.keep(REJECTS_NAME).name
                shown = os.path.join(os.path.dirname(config.out), kept)
                raise NothingToPackError(f"{exc}; its rejects are in {shown}") from None
            except (PackshardError, OSError):  # bad data or options, a machine limit:
                shutil.rmtree(work_folder(claim.out), ignore_errors=True)  # not for --resume
                raise
        claim.publish()
    shutil.rmtree(work_folder(claim.out), ignore_errors=True)
    warnings += claim.notes
    if note := backend_note(manifest["environment"]["backends"]):
        warnings.append(note)
    return PackResult(claim.out, manifest, time.perf_counter() - started, tuple(warnings))


def _pack_into(
    tmp: Path,
    config: PackConfig,
    files: Sequence[InputFile],
    loaded: DriverLoad,
    progress: bool,
    engine: Engine,
    note: Callable[[str], None],
    train_files: int,
) -> dict[str, Any]:
    bar = IngestProgress() if progress else None
    with RejectsWriter(tmp / REJECTS_NAME) as rejects:
        try:
            # workers still starting: the driver hashes and loads now, while they do
            hashes = hash_inputs(engine, list(files), meanwhile=loaded.start)
            spill, work, info = map_inputs(
                engine, config, list(files), hashes, rejects, loaded.start, _counted(bar), note
            )
        except PackshardError:
            if loaded.failed():  # the driver's own error comes first
                loaded.result()
            raise
        finally:
            if bar is not None:
                bar.close()
        spill = spill.compacted("source_index", "domain_codes", "starts", "turns")  # int8 mostly
        bundle, template = loaded.result()
        encoded = info.pop("encode", None)
        made = Provenance(
            inputs=[
                {"path": f.path, "resolved": str(f.real), "sha256": sha}
                for f, sha in zip(files, hashes, strict=True)
            ],
            tokenizer={**bundle.manifest_entry(), "resolved": str(Path(bundle.path).resolve())},
            template=_template_entry(template, config.ingest.loss),
            environment={
                **pack_environment(template_conventions()),
                "backends": backends_entry(
                    bundle,
                    config.ingest.backend,
                    render_entry(template, bundle.special_tokens_map, config.ingest.backend),
                    encoded,
                ),
            },
            reasoning_dropped=info.pop("reasoning_dropped", 0),
            pairs_read=info.pop("pairs_read", 0),
            engine={"name": engine.name, "workers": engine.workers, **info},
        )
        return pack_spill(tmp, config, spill, rejects, made, train_files, engine, work, note)


@dataclass(frozen=True)
class Provenance:
    """What made a spill, for the manifest: inputs, tokenizer, template, environment, engine.

    ``pack`` knows it from its ingest; ``repack`` from the parent's manifest, whose tokens the
    spill holds (``parent`` names that folder).  ``inputs`` are the manifest's entries without
    ``records`` (counted by :func:`pack_spill`).  ``examples_by_policy``, when given, is the
    packed examples' count per loss policy, for a spill whose examples do not know their record
    format (a repack of a pack of several formats that keeps every example whole).
    """

    inputs: list[dict[str, Any]]
    tokenizer: dict[str, Any]
    template: dict[str, Any]
    environment: dict[str, Any]
    engine: dict[str, Any]
    reasoning_dropped: int = 0
    pairs_read: int = 0
    parent: dict[str, Any] | None = None
    examples_by_policy: dict[str, int] | None = None  # known without per-example formats

    def fingerprints(self) -> dict[str, Any]:
        """Return what the output depends on besides the recorded config (the id's inputs)."""
        return {
            "format_version": FORMAT_VERSION,
            "inputs": [entry["sha256"] for entry in self.inputs],
            "tokenizer": self.tokenizer["sha256"],
            "template": self.template["sha256"],
        }


def pack_spill(
    tmp: Path,
    config: PackConfig,
    spill: Spill,
    rejects: RejectsWriter,
    made: Provenance,
    train_files: int,
    engine: Engine,
    work: Path,
    note: Callable[[str], None],
) -> dict[str, Any]:
    """Plan a spill, write its shards, index, card and manifest into ``tmp``; return the manifest.

    The one route from spilled examples to a folder, for ``pack`` and ``repack``.
    ``rejects`` holds every reject so far, in (input, line) order; the policies here add theirs
    and close it.
    """
    with rejects:
        is_eval = eval_examples(spill, config, train_files)
        target = config.plan.mix_target()
        mixing = target is not None and len(spill) > 0  # nothing spilled: nothing to pack
        if mixing and spill.pair_codes is not None and spill.pair_codes.any():
            raise UsageError(
                "--mix does not take preference or KTO records yet (a repeated pair would need "
                "its own pair_id): pack the pairs without --mix, or mix the chat data alone"
            )
        mixed = mix_examples(spill, target, config.plan.seed) if mixing and target else None
        if mixed is not None and mixed.choice.note is not None:
            note(f"--mix-best-effort: {mixed.choice.note}")
        plan = plan_examples(spill, config, is_eval, mixed.index if mixed is not None else None)
        if mixed is not None:
            rejects.write(mix_drops(spill, mixed))
        rejects.write(wrapped_drops(spill, plan))
        tally = rejects.close()
    if plan.num_rows == 0:
        raise NothingToPackError(_nothing_packed(spill, tally, config, made))
    ordering = ordering_stats(plan)
    split_at = train_rows(spill, plan, is_eval)
    plan = plan.permute_rows(row_order(plan, config, split_at)).narrowed()
    repeats = example_repeats(plan) if mixed is not None else None
    dataset_id = compute_dataset_id(config.recorded(), made.fingerprints())
    bounds, names = split_bounds(
        plan, split_at, config.shards.shard_rows, config.shards.shard_bytes
    )
    resolved, by_policy = loss_policies(spill, plan, config.ingest.loss)
    by_policy = by_policy if made.examples_by_policy is None else made.examples_by_policy
    per_input = records_per_input(spill, tally)
    stats = {
        **pack_stats(spill, plan, tally, ordering),
        **_beside_bfd(spill, plan, config, mixed.index if mixed is not None else None),
        "reasoning_dropped": made.reasoning_dropped,
        **pair_stats(spill, plan, made.pairs_read),
        **({"splits": split_stats(spill, plan, split_at)} if is_eval is not None else {}),
    }
    if mixed is not None and repeats is not None:
        stats["mix"] = mix_stats(spill, plan, repeats, mixed)
    # each stage frees what no later one reads; the shards read only the token offsets (their
    # rows are known from the bounds), the index the rest
    spill = spill.without("loss_tokens", "parts", "record_ids", "format_codes")
    plan = plan.compacted("seg_part", "seg_start")
    trim_heap()  # the statistics' temporaries, before the index's chunk
    shard_rows = [hi - lo for lo, hi in bounds]
    tables = examples_tables(spill, plan, shard_rows, is_eval, repeats)
    faults = parse_faults(os.environ.get(FAULTS_ENV))
    shards = write_shards_on(
        engine,
        tmp,
        spill.without("source_index", "lines", "starts", "domain_codes", "truncated", "turns"),
        plan.without("seg_part", "seg_targets"),
        bounds,
        dataset_id,
        config.shards.compression,
        work,
        faults,
        names,
        # the index is written while the workers write the shards (after them, in process)
        meanwhile=partial(write_examples, tmp / EXAMPLES_NAME, tables, dataset_id),
    )
    split = is_eval is not None
    del spill, plan, is_eval, tables, repeats  # what is left holds no per-example state
    manifest = build_manifest(
        dataset_id=dataset_id,
        config=config.recorded(),
        tokenizer=made.tokenizer,
        template=made.template,
        inputs=[{**entry, "records": n} for entry, n in zip(made.inputs, per_input, strict=True)],
        stats=stats,
        files={
            "examples": {"path": EXAMPLES_NAME, "sha256": sha256_path(tmp / EXAMPLES_NAME)},
            "rejects": {"path": REJECTS_NAME, "sha256": sha256_path(tmp / REJECTS_NAME)},
        },
        shards=shard_entries(shards, split),
        loss={"option": config.ingest.loss, "by_format": resolved, "examples_by_policy": by_policy},
        engine=made.engine,
        environment=made.environment,
    )
    if made.parent is not None:
        manifest["parent"] = made.parent
    manifest["files"]["card"] = write_card(tmp, manifest)  # README.md: load_dataset(OUT) reads it
    write_manifest(tmp, manifest)
    return manifest


def _template_entry(template: ChatTemplate | None, loss: str) -> dict[str, Any]:
    if template is None:
        return {"source": None, "sha256": None, "label_spans": "none"}
    entry = {
        "source": template.source,
        "sha256": template.sha256,
        "label_spans": "none" if loss == "all" else template.label_spans,
        "reasoning_field": reasoning_field(template),
    }
    if Path(template.source).is_file():  # a file (not builtin:NAME or the tokenizer config)
        entry["resolved"] = str(Path(template.source).resolve())
    return entry


def _counted(bar: IngestProgress | None) -> Callable[[UnitResult], None]:
    if bar is None:
        return lambda result: None
    return lambda result: bar.add(result.records, result.tokens)


def _nothing_packed(spill: Spill, tally: RejectTally, config: PackConfig, made: Provenance) -> str:
    records = sum(spill.counts.records_per_source) + tally.total(REJECTED)
    codes = ", ".join(f"{code} {n}" for code, n in tally.by_code.items()) or "no records"
    fix = "fix the inputs or the options, e.g. --max-seq-len, --overlong"
    top, most = max(tally.by_code.items(), key=lambda kv: kv[1], default=("", 0))
    if most * 2 > sum(tally.by_code.values()) and reject_kind(top) == REJECTED:  # dominates
        cause = likely_cause(top, config.ingest.format, [e["resolved"] for e in made.inputs])
        fix = f"likely cause: {cause}"
    return (
        f"nothing to pack: none of the {records} records read was packed ({codes}); no "
        f"output was written ({fix})"
    )


def _beside_bfd(
    spill: Spill, plan: RowPlan, config: PackConfig, mixed: np.ndarray | None = None
) -> dict[str, Any]:
    """With ``--strategy sequential``: the rows and fill rate BFD gives the same examples.

    ``mixed`` (``--mix``) lists the examples planned, an example once per copy.
    """
    if config.plan.strategy != "sequential":
        return {}
    lengths = spill.lengths if mixed is None else spill.lengths[mixed]
    codes = spill.pair_codes if mixed is None else None  # --mix refuses pairs: no pair units
    rows = plan_pair_units(lengths, codes, config.plan.max_seq_len, "bfd").num_rows
    bfd = fill_rate(plan.num_tokens, rows, plan.max_seq_len)
    return {"bfd_rows": rows, "bfd_fill_rate": round(bfd, 6)}
