"""The pipeline on an engine: inputs cut into units, mapped by workers, merged by the driver.

Every ``pack`` takes this path (``--workers 1`` on the serial engine, in the driver's
process, with the driver's tokenizer and template); the stages after the merge (plan,
shuffle, examples index, rejects, manifest) are the pipeline's own::

    driver                                    workers (this process, local processes, Ray)
    expand_inputs ─► hash every input ──────► sha256 per file
    plan_units (byte ranges, row groups; small whole inputs gathered)
    skip units already done (--resume) ─────► map_unit per unit: spill part + UnitResult
    merge_units (lines, codes, ids, rejects order)
    plan_packs over all lengths (or per group) ─ permute rows ─ shard_bounds
                                    ─────────► write_task per shard: shard file + ShardInfo
    examples index, rejects, manifest ─► publish (the pipeline's atomic rename)

The work folder ``.OUT.units`` beside the output holds the units' spill parts and their
completion markers, under a ``job.json`` fingerprint of everything that decides their
content (options, library versions, input hashes, tokenizer and template, unit size).
``--resume`` keeps the units of a folder whose fingerprint matches and whose files hash as
recorded (:mod:`packshard.pack.units.resume`); any other run starts it afresh.  It is removed
once the output is published or a run stops on bad data, options or a machine limit, and
kept when a task keeps failing or the run is interrupted, so that ``--resume`` can continue.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from packshard.digests import sha256_path
from packshard.engine import Beside, Engine, open_engine, while_starting, worker_share
from packshard.engine.faults import FAULTS_ENV, parse_faults
from packshard.engine.heap import pad_heap, trim_heap
from packshard.format.folder.outdir import work_folder
from packshard.format.rejects import RejectsWriter
from packshard.ingest import (
    InputFile,
    Stage,
    UnitTask,
    file_bytes,
    merged_entry,
    open_stage,
    plan_units,
    tokenizer_json_path,
)
from packshard.ingest.types import StageSpec
from packshard.pack.config import PackConfig
from packshard.pack.plan.planner import warm_planner
from packshard.pack.spill import Spill
from packshard.pack.units.columns import COLUMNS, map_columns
from packshard.pack.units.early import warm_up
from packshard.pack.units.map import SpillSink, map_unit
from packshard.pack.units.merge import merge_units
from packshard.pack.units.resume import job_parts, open_work, reusable_unit
from packshard.pack.units.stored import MappedUnit, drop_arrays
from packshard.store import hash_object, is_url

TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
"""Beside ``tokenizer.json``: what :func:`~packshard.ingest.tokens.tokenizer.load_tokenizer`
reads."""


def driver_load(config: PackConfig, pool: ThreadPoolExecutor) -> Beside[Stage]:
    """Load the driver's stage (the manifest needs its tokenizer and template) beside the map.

    Workers in other processes load their own; :func:`map_inputs` starts this load when its
    tasks are handed out, :func:`hash_inputs` earlier while the workers still start
    (:class:`~packshard.engine.startup.Beside`); the planner's kernels follow it.  It builds
    no encoder: the units report what encoded them.  Tasks run in the driver's process use
    this load (:func:`~packshard.ingest.stage.loaded.sharing`); the load and its checks are
    the stage's (:func:`~packshard.ingest.stage.open.open_stage`).
    """
    c = config
    load = partial(open_stage, c.tokenizer, c.template, c.ingest, c.allow_split_markers)
    return Beside(pool, load, partial(warm_planner, c.plan.strategy))


def worker_env(config: PackConfig) -> dict[str, str]:
    """Tokenizer threads per worker: ``--num-workers``, else the worker's share of the cores."""
    threads = config.num_workers or worker_share(config.engine)
    return {"RAYON_NUM_THREADS": str(threads)}


def engine_for(config: PackConfig, shared: Path) -> AbstractContextManager[Engine]:
    """Open the engine of ``config`` (the serial one for one local worker).

    ``shared``: the staging folder, beside the work units, that every task must reach.
    """
    return open_engine(config.engine, worker_env(config), warm_up(config), (shared,))


def setup_files(config: PackConfig) -> dict[str, str | None]:
    """SHA-256 of each file the tokenizer and template load from (None: absent), and the spec.

    What decides the units' content besides the inputs and options, known before anything is
    loaded: the driver loads the tokenizer while the workers map.
    """
    main = tokenizer_json_path(config.tokenizer)
    files = [main, *(main.parent / n for n in TOKENIZER_FILES)]
    digests: dict[str, str | None] = {
        str(f): sha256_path(f) if f.is_file() else None for f in files
    }
    digests["template"] = config.template
    if config.template is not None and Path(config.template).is_file():
        digests["template_file"] = sha256_path(Path(config.template))
    return digests


HASH_TASKS = 4
"""Hash tasks per worker: the inputs are hashed in that many runs of consecutive files."""


def _hash(paths: list[str]) -> list[str]:
    """SHA-256 of each local file or store object (read where the task runs)."""
    return [hash_object(path) if is_url(path) else sha256_path(path) for path in paths]


def hash_inputs(
    engine: Engine, files: list[InputFile], meanwhile: Callable[[], None] = lambda: None
) -> list[str]:
    """SHA-256 of every input: the driver's own while its workers start, the rest theirs.

    The driver hashes the inputs in order while the workers start
    (:func:`~packshard.engine.startup.while_starting`) and leaves the file in hand within a
    chunk (1 MiB) once they are up; the rest go to the workers, a few tasks of consecutive
    files per worker.  ``meanwhile`` is called once if the workers are found starting.  The
    driver stops at the first store object; workers hash those in ranged reads
    (:func:`~packshard.store.objects.hash_object`).
    """
    digests = while_starting(engine, files, _own_hash, meanwhile)
    rest = files[len(digests) :]
    if not rest:
        return digests
    runs = _runs([file_bytes(f) for f in rest], HASH_TASKS * max(1, engine.workers))
    paths = [f.path if f.in_store else str(f.real) for f in rest]
    keys = [
        rest[a].path if b - a == 1 else f"{rest[a].path} (+{b - a - 1} inputs)" for a, b in runs
    ]
    hashed = engine.run(_hash, [paths[a:b] for a, b in runs], keys)
    return digests + [digest for run in hashed for digest in run]


def _own_hash(file: InputFile, stopped: Callable[[], bool]) -> str | None:
    """Hash a local input in the driver (None for a store object: the workers read those)."""
    return None if file.in_store else sha256_path(file.real, until=stopped)


def _runs(sizes: list[int], count: int) -> list[tuple[int, int]]:
    """Cut ``range(len(sizes))`` into at most ``count`` runs of about equal total size."""
    target = max(1, -(-sum(sizes) // max(1, count)))
    runs, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        total += size
        if total >= target:
            runs.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes):
        runs.append((start, len(sizes)))
    return runs


@dataclass(frozen=True, slots=True)
class MapCounts:
    """What the map stage counted over every unit, for the manifest."""

    units: int
    units_reused: int  # finished units --resume kept
    reasoning_dropped: int  # trained turns whose reasoning the template left out
    pairs_read: int  # preference records read (packed or rejected)
    encode: dict[str, Any] | None  # what encoded the units (backends.merged_entry)


def map_inputs(
    engine: Engine,
    config: PackConfig,
    files: list[InputFile],
    hashes: list[str],
    rejects: RejectsWriter,
    started: Callable[[], None] = lambda: None,
    done: Callable[[MappedUnit], None] = lambda result: None,
    note: Callable[[str], None] = lambda text: None,
) -> tuple[Spill, Path, MapCounts]:
    """Map every unit (reusing finished ones on ``--resume``), merge, write the rejects.

    ``started`` is called once the map tasks are handed to the engine, ``done`` with each
    unit's result as it finishes (reused ones first); ``note`` hears what ``--resume`` could
    not reuse, and why (:mod:`packshard.pack.units.resume`).
    """
    units = plan_units(files, config.split_bytes)
    options = {
        **config.recorded(),
        "on_error": config.ingest.on_error,
        "ingest": [config.ingest.batch_size, config.split_bytes],
    }
    parts = job_parts(options, [f.path for f in files], hashes, setup_files(config))
    work = work_folder(Path(config.out))
    open_work(work, parts, config.resume, note)
    stage = StageSpec(config.tokenizer, config.template, config.ingest)
    sink = SpillSink(
        max_seq_len=config.plan.max_seq_len,
        overlong=config.plan.overlong,
        split_at_rows=config.plan.strategy == "wrapped",
        work=str(work),
        faults=parse_faults(os.environ.get(FAULTS_ENV)),
    )
    results: list = [reusable_unit(work / unit.name, unit, note) for unit in units]
    for reused in (r for r in results if r is not None):
        done(reused)
        drop_arrays(reused)  # read back one at a time by the merge, from the unit's folder
    todo = [i for i, r in enumerate(results) if r is None]
    tasks = [UnitTask(stage, units[i], sink) for i in todo]
    keys = [t.unit.describe() for t in tasks]
    mapped = engine.run(
        map_unit,
        tasks,
        keys,
        on_result=lambda _, r: _done(done, r),
        on_started=started,
    )
    for i, result in zip(todo, mapped, strict=True):
        results[i] = result
    pad_heap(0)  # the driver's peak is ahead, from the merge on: no pad there
    trim_heap()
    spill, ordered = merge_units(results, tuple(f.path for f in files))
    spill = map_columns(spill, work / COLUMNS)  # resident only while a stage reads them
    rejects.write(ordered)
    counts = MapCounts(
        units=len(units),
        units_reused=len(units) - len(todo),
        reasoning_dropped=sum(r.read.reasoning_dropped for r in results),
        pairs_read=sum(r.read.pairs_read for r in results),
        encode=merged_entry([r.read.encode for r in results]),
    )
    return spill, work, counts


def _done(done: Callable[[MappedUnit], None], result: MappedUnit) -> None:
    """Count a mapped unit, then let go of its arrays (the merge reads them back)."""
    done(result)
    drop_arrays(result)
