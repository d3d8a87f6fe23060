"""The map stage: one work unit read, tokenized, labelled and spilled by a worker.

``map_unit`` runs in a worker process (local or Ray) on one work unit (one range, or several
small whole inputs gathered, :func:`~packshard.ingest.read.units.plan_units`): the ingest's
one unit task (:func:`~packshard.ingest.stage.unit.run_unit`) with the spill as its sink::

    run_unit: read, ingest (normalize, render, tokenize, label) ─► SpillSink's writer
        │                                          (overlong policy) │
        │                                   tokens.bin, labels.bin ◄─┘  (the unit's spill part)
        └─► UnitResult[SpillPart]: per-example integers, rejects, counts ──► back to the driver

Only small things travel back: the per-example integers, each in its smallest type (about 20
bytes an example), the rejects and counts (:mod:`packshard.pack.units.stored`).  Lines are
relative to the unit's range and codes of inputs, domains and formats local to the unit; the
driver makes them global (:mod:`packshard.pack.units.merge`).

Idempotent and resumable: the part is written into an attempt folder and renamed to the
unit's own name (``00003-bytes-0-4194304``) only when complete, with ``unit.json`` as its
completion marker: a retried or resumed task that finds it returns what it holds.  Tokenizer
and template are loaded once per process (:func:`packshard.ingest.stage.loaded.sharing`).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import ne
from pathlib import Path

import numpy as np

from packshard.engine import worker_cores
from packshard.engine.faults import inject
from packshard.engine.heap import BUSY_PAD, pad_heap
from packshard.ingest import (
    ChatTemplate,
    TokenizerBundle,
    UnitRead,
    UnitTask,
    WorkUnit,
    run_unit,
    warm_stage,
)
from packshard.ingest.types import IngestChunk, StageSpec
from packshard.pack.spill import PER_EXAMPLE, SpillWriter, smallest
from packshard.pack.units.stored import (
    MARKER,
    MappedUnit,
    SpillPart,
    load_unit,
    save_unit,
    unit_result,
)
from packshard.records import Reject


@dataclass(frozen=True, slots=True)
class SpillSink:
    """What every map task of one job shares: the spill's options and the work folder."""

    max_seq_len: int
    overlong: str
    split_at_rows: bool
    work: str  # folder of the parts, reachable by every worker
    faults: tuple[tuple[str, str, int], ...] = ()

    @contextmanager
    def open(
        self,
        unit: WorkUnit,
        spec: StageSpec,
        bundle: TokenizerBundle,
        template: ChatTemplate | None,
    ) -> Iterator[SpillUnit]:
        """Spill ``unit`` into an attempt folder, renamed to the unit's own once complete."""
        work = Path(self.work)
        attempt = work / f".{unit.name}.attempt-{uuid.uuid4().hex[:12]}"
        attempt.mkdir(parents=True)
        try:
            yield SpillUnit(self, unit, attempt)
        finally:
            shutil.rmtree(attempt, ignore_errors=True)


MapTask = UnitTask[SpillSink]
"""One unit to map: the stage, the unit, the spill's options."""


@dataclass(slots=True)
class SpillUnit:
    """One unit's spill writer, its rejects and the lines of the records it accepted."""

    sink: SpillSink
    unit: WorkUnit
    folder: Path
    writer: SpillWriter = field(init=False)
    rejects: list[Reject] = field(default_factory=list)
    lines: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        # the unit's own inputs only: its codes and counts never repeat the job's input list
        sources = tuple(s.path for s in self.unit.ranges)
        sink = self.sink
        self.writer = SpillWriter(
            self.folder, sink.max_seq_len, sink.overlong, sink.split_at_rows, sources, compact=True
        )

    def add(self, chunk: IngestChunk) -> None:
        """Spill ``chunk``'s examples (the overlong policy's rejects kept in record order)."""
        self.rejects += chunk.rejects
        refs = chunk.batch.refs
        every = np.fromiter((r.line for r in refs), np.int64, count=len(refs))
        new = np.ones(len(refs), dtype=bool)  # a record's examples are adjacent; two
        if len(refs) > 1:  # inputs gathered in one unit may both hold a line 1
            new[1:] = np.fromiter(map(ne, refs[1:], refs[:-1]), bool, count=len(refs) - 1)
        self.lines.append(every[new])
        self.rejects += self.writer.add(chunk.batch)

    def finish(self, read: UnitRead) -> SpillPart:
        """Close the spill, write the marker, rename the part; return what was written."""
        spill = self.writer.finish()
        # each in its smallest integer type (the merge widens): what the driver holds of a unit
        arrays = {name: smallest(getattr(spill, name)) for name in PER_EXAMPLE}
        arrays["lengths"] = smallest(spill.lengths)
        lines = np.concatenate([np.zeros(0, np.int64), *self.lines])
        arrays["record_lines"] = smallest(lines)
        part = SpillPart(str(self.folder), arrays, spill.counts, tuple(self.rejects))
        del spill, lines
        doc = save_unit(self.folder, read, part, self.writer.digests())
        final = Path(self.sink.work) / self.unit.name
        if final.exists():  # an attempt that died after its rename but before returning
            shutil.rmtree(final)
        os.replace(self.folder, final)
        return unit_result(doc, arrays, final, self.unit).value  # what load_unit reads back


def warm_worker(specs: tuple[str, str | None, str] | tuple[str, str | None, str, bool]) -> None:
    """Warm a worker in the fork server: :func:`~packshard.ingest.stage.unit.warm_stage`."""
    warm_stage(specs)


def map_unit(task: MapTask) -> MappedUnit:
    """Map one unit (see the module docstring); runs in a worker."""
    sink, unit = task.sink, task.unit
    work = Path(sink.work)
    inject(unit.describe(), sink.faults, work / "_faults")
    final = work / unit.name
    if (final / MARKER).is_file():
        try:
            return load_unit(final, unit)
        except Exception:  # a marker left malformed: the unit is mapped again
            shutil.rmtree(final, ignore_errors=True)
    pad_heap(BUSY_PAD)  # batches come and go: keep the heap's top (packshard.engine.heap)
    return run_unit(task, worker_cores())
