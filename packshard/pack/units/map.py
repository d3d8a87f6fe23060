"""The map stage: one work unit read, tokenized, labelled and spilled by a worker.

``map_unit`` runs in a worker process (local or Ray) on one work unit (one range, or several
small whole inputs gathered, :func:`~packshard.ingest.read.units.plan_units`): the ingest's
one unit task (:func:`~packshard.ingest.stage.unit.run_unit`) with the spill as its sink::

    run_unit: read, ingest (normalize, render, tokenize, label) ─► SpillSink's writer
        │                                          (overlong policy) │
        │                                   tokens.bin, labels.bin ◄─┘  (the unit's spill part)
        └─► UnitResult[SpillPart]: per-example integers, rejects, counts ──► back to the driver

Only small things travel back: the per-example integers the driver plans with, each in its
smallest type (about 20 bytes an example of one-input, one-domain records; 67 in the
spill's own types), the rejects and counts.  The driver lets go of them once it has counted
the unit and reads them back from ``meta.npz`` when it merges that unit.  Lines of a byte
range are relative to its start, and codes of inputs, domains and formats local to the unit
(its inputs are codes 0, 1, … in unit order: what a unit writes and returns never lists the
job's inputs); the driver makes them global (:mod:`packshard.pack.units.merge`).

Idempotent and resumable: the part is written into an attempt folder and renamed to the
unit's own name (``00003-bytes-0-4194304``) only when complete, with ``unit.json`` as its
completion marker.  A retried or resumed task that finds the marker returns what it holds
instead of working again.  Tokenizer and template are loaded once per worker process and
kept for its later tasks; in the driver's own process (``--workers 1``) the tasks use the
driver's load (:func:`packshard.ingest.stage.loaded.sharing`), so that nothing is loaded twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import ne
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from packshard.digests import sha256_path
from packshard.engine import worker_cores
from packshard.engine.faults import inject
from packshard.engine.heap import BUSY_PAD, pad_heap
from packshard.ingest import (
    ChatTemplate,
    TokenizerBundle,
    UnitError,
    UnitRead,
    UnitResult,
    UnitTask,
    WorkUnit,
    run_unit,
    warm_stage,
)
from packshard.ingest.types import IngestChunk, StageSpec
from packshard.pack.spill import PER_EXAMPLE, SpillCounts, SpillWriter, smallest
from packshard.records import Reject, SourceRef

MARKER = "unit.json"
ARRAYS = "meta.npz"


@dataclass(frozen=True, slots=True)
class SpillPart:
    """What a map task keeps of its unit: the per-example integers, counts and rejects.

    ``arrays`` holds ``lengths`` and the spill's per-example arrays (lines relative to the
    unit's range, source codes into ``unit.ranges``, domain and format codes into
    ``counts.domains`` and ``counts.formats``), plus ``record_lines`` (the line of every
    record ingest accepted); ``folder`` is the unit's part.
    """

    folder: str
    arrays: dict[str, np.ndarray]
    counts: SpillCounts
    rejects: tuple[Reject, ...]

    @property
    def tokens(self) -> int:
        """Tokens spilled by the unit."""
        return int(self.arrays["lengths"].sum())


MappedUnit = UnitResult[SpillPart]
"""A map task's result: the ingest's counts and the unit's spill part."""


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


def unit_files(folder: Path, written: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the SHA-256 of every file of a unit's folder but its marker.

    ``written`` holds the digests of files hashed as they were written (the spill's, the
    arrays'): those are not read back; any other file is read and hashed.
    """
    known = written or {}
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.name != MARKER)
    return {p.name: known.get(p.name) or sha256_path(p) for p in found if p.name[0] != "."}


class _HashedStream:
    """A write-only stream that hashes what it passes on to ``fh``.

    It can neither tell nor seek, so the zip writer writes each member once, front to back
    (sizes in data descriptors), and the bytes hashed are the file's.  No copy of the arrays
    is made in memory: a ``BytesIO`` and its ``getvalue()`` held two, about 2 × 63 bytes an
    example of the unit, in the driver itself with ``--workers 1`` (where the peak of the
    map stage was, sampled by ``scripts/measure_driver_memory.py --stages``).
    """

    def __init__(self, fh: BinaryIO) -> None:
        self._fh, self._hash = fh, hashlib.sha256()

    def write(self, data: bytes, /) -> int:
        self._hash.update(data)
        return self._fh.write(data)

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        """Leave ``fh`` open: its owner closes it."""

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def save_unit(
    folder: Path, read: UnitRead, part: SpillPart, written: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Write a unit's result beside its part; ``unit.json`` last, as the completion marker.

    The input list is not repeated (the job knows it): the records per input are those of
    the unit's own inputs, in unit order, as its source codes are.

    The marker records every file's SHA-256, so that ``--resume`` reuses only the files the
    unit wrote (:mod:`packshard.pack.units.resume`): ``written`` gives those of the spill
    files, hashed as the spill writer wrote them, and the arrays are hashed as they are
    written (:class:`_HashedStream`), so no file is read back.  Returns the marker's
    content, as read back.
    """
    arrays: dict[str, Any] = part.arrays
    with open(folder / ARRAYS, "wb") as fh:
        stream = _HashedStream(fh)
        with zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True) as npz:
            for name, values in arrays.items():  # what numpy.savez writes, streamed
                with npz.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(values), allow_pickle=False)
    written = {**(written or {}), ARRAYS: stream.hexdigest()}
    counts = {k: getattr(part.counts, k) for k in SpillCounts.__slots__ if k != "sources"}
    counts["records_per_source"] = list(part.counts.records_per_source)  # its own inputs
    error = read.error
    doc: dict[str, Any] = {
        "counts": counts,
        "rejects": [[r.ref.source, r.ref.line, r.domain, r.code, r.reason] for r in part.rejects],
        "records": read.records,
        "newlines": read.newlines,
        "error": None if error is None else [error.code, error.reason, error.source, error.line],
        "reasoning_dropped": read.reasoning_dropped,
        "pairs_read": read.pairs_read,
        "encode": read.encode,
        "files": unit_files(folder, written),
    }
    text = json.dumps(doc, ensure_ascii=False)
    tmp = folder / f".{MARKER}.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, folder / MARKER)
    return json.loads(text)


def load_unit(folder: Path, unit: WorkUnit) -> MappedUnit:
    """Read back a completed unit (its marker and arrays; never the tokens)."""
    doc = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    with np.load(folder / ARRAYS, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    return unit_result(doc, arrays, folder, unit)


def unit_arrays(result: MappedUnit) -> dict[str, np.ndarray]:
    """Return a unit's per-example arrays: those it came back with, else read from its folder.

    The driver lets go of each unit's arrays once it has counted it (:func:`drop_arrays`),
    so that only the unit being merged is in memory, never every unit's at once.
    """
    part = result.value
    if part.arrays:
        return part.arrays
    with np.load(Path(part.folder) / ARRAYS, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def unit_examples(result: MappedUnit) -> int:
    """Return how many examples a unit spilled (its ``lengths`` read back if dropped)."""
    part = result.value
    if part.arrays:
        return int(part.arrays["lengths"].shape[0])
    with np.load(Path(part.folder) / ARRAYS, allow_pickle=False) as npz:
        return int(npz["lengths"].shape[0])


def drop_arrays(result: MappedUnit) -> MappedUnit:
    """Let go of a unit's per-example arrays (they are in its folder's ``meta.npz``)."""
    result.value.arrays.clear()
    return result


def unit_result(
    doc: dict[str, Any], arrays: dict[str, np.ndarray], folder: Path, unit: WorkUnit
) -> MappedUnit:
    """Return the unit of marker content ``doc`` and ``arrays`` (those ``meta.npz`` holds)."""
    fields: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in doc["counts"].items()
    }
    counts = SpillCounts(**fields)
    rejects = tuple(Reject(SourceRef(s, ln), d, c, why) for s, ln, d, c, why in doc["rejects"])
    error = None if doc["error"] is None else UnitError(*doc["error"])
    read = UnitRead(
        records=doc["records"],
        newlines=doc["newlines"],
        error=error,
        reasoning_dropped=doc.get("reasoning_dropped", 0),
        pairs_read=doc.get("pairs_read", 0),
        encode=doc.get("encode"),
    )
    return UnitResult(unit, read, SpillPart(str(folder), arrays, counts, rejects))
