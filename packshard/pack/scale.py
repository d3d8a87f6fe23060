"""The pipeline on an engine: inputs cut into units, mapped by workers, merged by the driver.

``pack --workers N`` (N > 1), ``--engine ray`` and ``--resume`` take this path; the stages
after the merge (plan, shuffle, examples index, rejects, manifest) are the pipeline's own::

    driver                                    workers (local processes or Ray tasks)
    expand_inputs ─► hash every input ──────► sha256 per file
    plan_splits (byte ranges, row groups)
    skip units already done (--resume) ─────► map_unit per unit: spill part + UnitResult
    merge_units (lines, codes, ids, rejects order)
    plan_packs over all lengths (or per group) ─ permute rows ─ shard_bounds
                                    ─────────► write_task per shard: shard file + ShardInfo
    examples index, rejects, manifest ─► publish (the pipeline's atomic rename)

The work folder ``.OUT.units`` beside the output holds the units' spill parts and their
completion markers, under a ``job.json`` fingerprint of everything that decides their
content (options, library versions, input hashes, tokenizer and template, unit size).
``--resume`` keeps the units of a folder whose fingerprint matches and whose files hash as
recorded (:mod:`packshard.pack.resume`); any other run starts it afresh.  It is removed
once the output is published, and kept when a run fails, so that ``--resume`` can continue.
Driver memory holds the per-example integers (:mod:`packshard.pack.spill`), the plan and the
rejects; tokens stay in the parts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from packshard.digests import sha256_path
from packshard.engine import Engine, EngineOptions, open_engine
from packshard.engine.faults import FAULTS_ENV, parse_faults
from packshard.format.outdir import temp_stem
from packshard.format.rejects import RejectsWriter
from packshard.ingest.sources import InputFile
from packshard.ingest.splits import plan_splits
from packshard.ingest.templates import ChatTemplate, load_template
from packshard.ingest.tokenizer import TokenizerBundle, load_tokenizer, tokenizer_json_path
from packshard.pack.config import PackConfig
from packshard.pack.merge import merge_units
from packshard.pack.resume import job_parts, open_work, reusable_unit
from packshard.pack.spill import Spill
from packshard.pack.units import MapTask, UnitContext, map_unit, warm_worker

TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
"""Beside ``tokenizer.json``: what :func:`~packshard.ingest.tokenizer.load_tokenizer` reads."""
UNIT_BATCH = 256
"""Records per ingest chunk inside a unit: small chunks keep rendering, tokenizing and
labelling overlapped in a unit of a few chunks.  Any size gives the same output (the merge
orders rejects by ``--batch-size`` chunks, whatever the units used)."""


class DriverLoad:
    """The driver's tokenizer and template (the manifest needs them), loaded on a thread.

    On an engine the workers load their own.  While they are still starting, the driver loads
    at once; when they are ready, its load starts once the map tasks are handed out
    (:func:`map_inputs` calls :meth:`start`), so that it runs while they
    map instead of before: it holds the GIL for most of its time, and would delay the first
    tasks.  Without an engine it is awaited at once.
    """

    def __init__(self, config: PackConfig, pool: ThreadPoolExecutor) -> None:
        self._config, self._pool = config, pool
        self._future: Future[tuple[TokenizerBundle, ChatTemplate | None]] | None = None

    def start(self) -> None:
        """Start loading, once."""
        if self._future is None:
            self._future = self._pool.submit(self._load)

    def _load(self) -> tuple[TokenizerBundle, ChatTemplate | None]:
        bundle = load_tokenizer(self._config.tokenizer)
        return bundle, load_template(self._config.template, bundle)

    def result(self) -> tuple[TokenizerBundle, ChatTemplate | None]:
        """Return the tokenizer and template (raising what loading raised), once loaded."""
        self.start()
        assert self._future is not None
        return self._future.result()

    def failed(self) -> bool:
        """Whether loading raised, once it is done."""
        self.start()
        assert self._future is not None
        return self._future.exception() is not None


def work_folder(out: Path) -> Path:
    """Where the units of a pack into ``out`` live: ``.OUT.units`` beside it.

    ``OUT`` is shortened as for the temporary folder (:func:`~packshard.format.outdir.
    temp_stem`), so any legal OUT name leaves room for the suffix.
    """
    return out.parent / f".{temp_stem(out.name)}.units"


def worker_env(config: PackConfig) -> dict[str, str]:
    """Tokenizer threads per worker: ``--num-workers``, else the cores shared out."""
    if config.num_workers:
        threads = config.num_workers
    elif config.engine == "ray":
        threads = 1  # Ray gives each task one CPU
    else:
        threads = max(1, (os.cpu_count() or 1) // config.workers)
    return {"RAYON_NUM_THREADS": str(threads)}


@contextmanager
def engine_for(config: PackConfig) -> Iterator[Engine | None]:
    """Yield the engine of ``config``, or None for the single-process path."""
    if config.engine == "local" and config.workers == 1 and not config.resume:
        yield None
        return
    options = EngineOptions(config.engine, config.workers, config.ray_address)
    warm = (warm_worker, (config.tokenizer, config.template))
    with open_engine(options, worker_env(config), warm) as engine:
        yield engine


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


def _hash(path: str) -> str:
    return sha256_path(Path(path))


def hash_inputs(engine: Engine, files: list[InputFile]) -> list[str]:
    """SHA-256 of every input, one task per file."""
    return engine.run(_hash, [str(f.real) for f in files], [f.path for f in files])


def map_inputs(
    engine: Engine,
    config: PackConfig,
    files: list[InputFile],
    hashes: list[str],
    rejects: RejectsWriter,
    started: Callable[[], None] = lambda: None,
    note: Callable[[str], None] = lambda text: None,
) -> tuple[Spill, Path, dict[str, int]]:
    """Map every unit (reusing finished ones on ``--resume``), merge, write the rejects.

    ``started`` is called once the map tasks are handed to the engine; ``note`` hears what
    ``--resume`` could not reuse, and why (:mod:`packshard.pack.resume`).
    """
    splits = plan_splits(files, config.split_bytes)
    options = {
        **config.recorded(),
        "on_error": config.on_error,
        "ingest": [config.batch_size, config.split_bytes],
    }
    parts = job_parts(options, [f.path for f in files], hashes, setup_files(config))
    work = work_folder(Path(config.out))
    open_work(work, parts, config.resume, note)
    context = UnitContext(
        tokenizer=config.tokenizer,
        template=config.template,
        options=replace(config.ingest_options(), batch_size=min(config.batch_size, UNIT_BATCH)),
        max_seq_len=config.max_seq_len,
        overlong=config.overlong,
        split_at_rows=config.strategy == "wrapped",
        sources=tuple(f.path for f in files),
        work=str(work),
        faults=parse_faults(os.environ.get(FAULTS_ENV)),
    )
    results: list = [None] * len(splits)
    for i, split in enumerate(splits):
        results[i] = reusable_unit(work / split.name, split, note)
    todo = [i for i, r in enumerate(results) if r is None]
    tasks = [MapTask(context, splits[i]) for i in todo]
    mapped = engine.run(map_unit, tasks, [t.split.describe() for t in tasks], on_started=started)
    for i, result in zip(todo, mapped, strict=True):
        results[i] = result
    spill, ordered = merge_units(results, context.sources, config.batch_size)
    rejects.write(ordered)
    info = {"units": len(splits), "units_reused": len(splits) - len(todo)}
    info["reasoning_dropped"] = sum(r.reasoning_dropped for r in results)
    return spill, work, info
