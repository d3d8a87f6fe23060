"""``pack``: the whole job, from input files to an audited output folder.

Stages, each its own module, in this order::

    expand_inputs ─► ingest (read, normalize, render, tokenize, label)
      ─► SpillWriter (overlong policy) ─► [--mix: copies per record, packshard.pack.plan.mix]
      ─► plan_packs (lengths only) ─► finalize_plan
      ─► shuffle rows (seed) ─► stats ─► examples index ─► assemble_ranges + write_shard
      ─► rejects ─► dataset card ─► manifest (last)

Everything after the spill is :func:`~packshard.pack.finish.pack_spill`, the route ``repack``
takes too.

Memory holds the plan, one chunk of the examples index (131,072 rows) and a shard's row
groups; tokens wait on disk in the spill, and the per-example columns (token offsets
included) in files mapped and handed back after each stage
(:mod:`packshard.pack.units.columns`).  Each stage drops the columns no later stage reads
(:meth:`~packshard.pack.spill.Spill.without`, :meth:`~packshard.pack.plan.rows.RowPlan.without`)
and the heap is trimmed between stages (:func:`~packshard.engine.heap.trim_heap`): about 22
bytes an example at the driver's peak (``docs/scale.md`` has each byte).  Each stage returns a
typed value (the spill with what it accepted, the rejects file's tally, the plan, the shards'
entries) and :func:`~packshard.pack.counts.pack_stats` combines them once.

Atomicity: everything is written into ``.NAME.partial-PID`` beside ``OUT``, the manifest last,
and renamed to ``OUT`` only when complete (:mod:`packshard.format.folder`).  A run that packs
nothing fails and writes no ``OUT``.

Determinism: the same inputs and options give byte-identical shards and examples index; only
the manifest's ``created_at`` differs.  Example ids number the packed examples in input order
(record order, then part).

The ingest and the shard writing run as tasks on an engine (:mod:`packshard.pack.units.scale`),
whatever ``--workers``; every other stage is this module's, so any engine and any worker
count give the same bytes.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from packshard.engine import Beside, Engine, TaskFailed, terminating
from packshard.engine.heap import return_freed_memory
from packshard.errors import (
    NothingToPackError,
    PackshardError,
    UsageError,
)
from packshard.format.environment import pack_environment
from packshard.format.folder.claim import claim_out
from packshard.format.folder.outdir import work_folder
from packshard.format.rejects import REJECTS_NAME, RejectsWriter
from packshard.ingest import (
    IngestProgress,
    Stage,
    backend_note,
    open_progress,
    sharing_stage,
    template_conventions,
)
from packshard.ingest.types import StageSpec
from packshard.pack.config import PackConfig, check_config
from packshard.pack.finish import PackResult, Provenance, pack_spill
from packshard.pack.plan.schedule import check_eval_files
from packshard.pack.units.early import ListedInputs, list_inputs, sized_config
from packshard.pack.units.scale import driver_load, engine_for, hash_inputs, map_inputs
from packshard.pack.units.stored import MappedUnit
from packshard.store import claim_store, is_url, publish_store


def pack_dataset(
    config: PackConfig,
    progress: bool | str | None = False,
    notify: Callable[[str], None] | None = None,
    inputs: ListedInputs | None = None,
) -> PackResult:
    """Run the whole ``pack`` job and return the written folder and manifest.

    ``progress`` is a mode of :func:`~packshard.ingest.progress.progress_mode`.  ``notify``
    hears at once what was done beside OUT (else it comes back among the warnings).
    ``inputs`` is ``config``'s inputs as already listed (listed here when None).
    """
    if is_url(config.out):
        return _pack_to_store(config, progress, notify)
    started = time.perf_counter()
    return_freed_memory()  # peak RSS is the live set (packshard.engine.heap)
    warnings = check_config(config)
    if config.num_workers:
        os.environ["RAYON_NUM_THREADS"] = str(config.num_workers)
    listed = inputs if inputs is not None else list_inputs(config)
    check_eval_files(listed.train, listed.evals)
    files = listed.files
    config = sized_config(config, listed)  # --workers auto, and the small job's encoder
    specs = config.inputs + config.eval_inputs
    reals = [(f.path, str(f.real)) for f in files]
    with claim_out(config.out, config.overwrite, specs, reals, notify) as claim:
        with engine_for(config, claim.tmp) as engine, ThreadPoolExecutor(1) as loader:
            loaded = driver_load(config, loader)
            try:
                with sharing_stage(
                    StageSpec(config.tokenizer, config.template, config.ingest), loaded.result
                ):
                    manifest = _pack_into(
                        claim.tmp, config, listed, loaded, progress, engine, claim.note
                    )
            except TaskFailed:
                raise  # the finished units are kept for --resume
            except NothingToPackError as exc:  # no folder, but the rejects say why
                shutil.rmtree(work_folder(claim.place), ignore_errors=True)
                kept = claim.keep(REJECTS_NAME).name
                shown = os.path.join(os.path.dirname(config.out), kept)
                raise NothingToPackError(f"{exc}; its rejects are in {shown}") from None
            except (PackshardError, OSError):  # bad data or options, a machine limit:
                shutil.rmtree(work_folder(claim.place), ignore_errors=True)  # not for --resume
                raise
        claim.publish()
    shutil.rmtree(work_folder(claim.place), ignore_errors=True)
    warnings += claim.notes
    if note := backend_note(manifest["environment"]["backends"]):
        warnings.append(note)
    return PackResult(claim.out, manifest, time.perf_counter() - started, tuple(warnings))


def _pack_to_store(
    config: PackConfig, progress: bool | str | None, notify: Callable[[str], None] | None
) -> PackResult:
    """Pack into a local staging folder under OUT's lock, then publish it, manifest last.

    The same stages write the same bytes as a local pack (:mod:`packshard.store.publish`).
    """
    if config.resume:
        raise UsageError(
            f"{config.out}: --resume needs the work folder beside a local OUT; a store OUT is "
            "staged locally per run (pack to a local folder to resume)"
        )
    with terminating(), claim_store(config.out, config.overwrite, "pack") as out:  # SIGTERM: unlock
        local = replace(config, out=str(out.stage), overwrite=False)
        result = pack_dataset(local, progress, notify)
        publish_store(out, result.out)
    return replace(result, published=str(out.url))


def _pack_into(
    tmp: Path,
    config: PackConfig,
    listed: ListedInputs,
    loaded: Beside[Stage],
    progress: bool | str | None,
    engine: Engine,
    note: Callable[[str], None],
) -> dict[str, Any]:
    files, train_files = listed.files, len(listed.train)
    bar = open_progress(progress, listed.size)
    with RejectsWriter(tmp / REJECTS_NAME) as rejects:
        try:
            # workers still starting: the driver hashes and loads now, while they do
            hashes = hash_inputs(engine, files, meanwhile=loaded.start)
            spill, work, mapped = map_inputs(
                engine, config, files, hashes, rejects, loaded.start, _counted(bar), note
            )
        except PackshardError:
            if loaded.failed():  # the driver's own error comes first
                loaded.result()
            raise
        finally:
            if bar is not None:
                bar.close()
        spill = spill.compacted("source_index", "domain_codes", "starts", "turns")  # int8 mostly
        entries = loaded.result().entries(mapped.encode)
        made = Provenance(
            inputs=[
                {
                    "path": f.path,
                    "resolved": f.path if is_url(f.path) else str(f.real),
                    "sha256": sha,
                }
                for f, sha in zip(files, hashes, strict=True)
            ],
            tokenizer=entries.tokenizer,
            template=entries.template,
            environment={**pack_environment(template_conventions()), "backends": entries.backends},
            reasoning_dropped=mapped.reasoning_dropped,
            pairs_read=mapped.pairs_read,
            engine={
                "name": engine.name,
                "workers": engine.workers,
                "units": mapped.units,
                "units_reused": mapped.units_reused,
            },
        )
        return pack_spill(tmp, config, spill, rejects, made, train_files, engine, work, note)


def _counted(bar: IngestProgress | None) -> Callable[[MappedUnit], None]:
    if bar is None:
        return lambda result: None
    return lambda r: bar.add(r.read.records, r.value.tokens, r.unit.size)
