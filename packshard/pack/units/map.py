"""The map stage: one work unit read, tokenized, labelled and spilled by a worker.

``map_unit`` runs in a worker process (local or Ray) on one work unit (one split, or several
small whole inputs gathered, :func:`~packshard.ingest.read.splits.plan_units`)::

    read_split ─► ingest (normalize, render, tokenize, label) ─► SpillWriter (overlong policy)
        │                                                            │
        │                                   tokens.bin, labels.bin ◄─┘  (the unit's spill part)
        └─► UnitResult: per-example integers, rejects, counts  ──► back to the driver

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
from collections.abc import Mapping
from dataclasses import dataclass
from operator import ne
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from packshard.digests import sha256_path
from packshard.engine import worker_cores
from packshard.engine.faults import inject
from packshard.errors import PackshardError, RecordError
from packshard.ingest.label.spans import render_example
from packshard.ingest.stage.loaded import load_early, loaded
from packshard.ingest.normalize import normalize_record
from packshard.ingest.read.splits import SplitRead, WorkUnit, read_split
from packshard.ingest.stream import ingest
from packshard.ingest.template.fast import renderer_for
from packshard.ingest.template.render import ChatTemplate
from packshard.ingest.tokens.backends import decided, warm_encoder
from packshard.ingest.tokens.labels import encode_texts, label_encodings
from packshard.ingest.tokens.tokenizer import TokenizerBundle
from packshard.ingest.types import IngestOptions, RawRecord
from packshard.pack.heap import BUSY_PAD, pad_heap
from packshard.pack.spill import PER_EXAMPLE, SpillCounts, SpillWriter, smallest
from packshard.records import Reject, SourceRef

MARKER = "unit.json"
ARRAYS = "meta.npz"


@dataclass(frozen=True, slots=True)
class UnitContext:
    """What every map task of one job shares."""

    tokenizer: str
    template: str | None
    options: IngestOptions
    max_seq_len: int
    overlong: str
    split_at_rows: bool
    work: str  # folder of the parts, reachable by every worker
    faults: tuple[tuple[str, str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class MapTask:
    """One unit to map."""

    context: UnitContext
    unit: WorkUnit


@dataclass(frozen=True)
class UnitResult:
    """What a map task returns: the unit's per-example integers, rejects and counts.

    ``arrays`` holds ``lengths`` and the spill's per-example arrays (lines relative to the
    split, source codes into ``unit.splits``, domain and format codes into ``counts.domains``
    and ``counts.formats``), plus ``record_lines`` (the line of every record ingest accepted).
    """

    unit: WorkUnit
    folder: str
    arrays: dict[str, np.ndarray]
    counts: SpillCounts
    rejects: tuple[Reject, ...]
    records: int
    newlines: int
    error: tuple[str, str, str, int] | None = None  # a RecordError's code, reason, place
    reasoning_dropped: int = 0  # trained turns whose reasoning the template left out
    pairs_read: int = 0  # preference records read (packed or rejected)
    encode: dict[str, Any] | None = None  # what encoded the unit (backends.decided)

    @property
    def tokens(self) -> int:
        """Tokens spilled by the unit."""
        return int(self.arrays["lengths"].sum())


def warm_worker(specs: tuple[str, str | None, str]) -> None:
    """Load the tokenizer, the template and the run's backends, and label one tiny record.

    ``specs`` are the tokenizer, the template and ``--backend``.  The tiny record also loads
    every jitted kernel labelling uses; run in the fork server, all of it is in each worker
    before its first unit (:mod:`packshard.engine.forkwarm`).  So are the fast renderer and
    encoder, which each worker would otherwise build again (0.25 CPU-s for phi-3's fastokens
    encoder, 1.33 for Qwen3's).  The encoder is only built here, never used, so that no
    state of its library's threads crosses the fork; each worker still decides and proves
    it (canary, first records) as before.  The loads are
    :func:`~packshard.ingest.stage.loaded.load_early`'s, already done when the server ran it.
    """
    tokenizer, template_spec, backend = specs
    load_early(specs)
    bundle, template = loaded(tokenizer, template_spec)
    value: dict[str, Any] = {"text": "warm"}
    if template is not None:
        value = {
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
        }
    try:
        if backend != "reference" and template is not None:
            renderer_for(template, bundle.special_tokens_map, backend)
        conv = normalize_record(RawRecord(SourceRef("warm", 1), "warm", value))
        rendered = [render_example(conv, template, bundle, "auto")]
        label_encodings(bundle, rendered, encode_texts(bundle, rendered))
    except PackshardError:  # a template that wants other turns: the first unit warms up
        return


def map_unit(task: MapTask) -> UnitResult:
    """Map one unit (see the module docstring); runs in a worker."""
    ctx, unit = task.context, task.unit
    work = Path(ctx.work)
    inject(unit.describe(), ctx.faults, work / "_faults")
    final = work / unit.name
    if (final / MARKER).is_file():
        try:
            return load_unit(final, unit)
        except Exception:  # a marker left malformed: the unit is mapped again
            shutil.rmtree(final, ignore_errors=True)
    bundle, template = loaded(ctx.tokenizer, ctx.template)
    warm_encoder(bundle, ctx.options.backend)  # decided while the first records render
    pad_heap(BUSY_PAD)  # batches come and go: keep the heap's top (packshard.pack.heap)
    attempt = work / f".{unit.name}.attempt-{uuid.uuid4().hex[:12]}"
    attempt.mkdir(parents=True)
    try:
        result, written = _map_into(attempt, ctx, unit, bundle, template)
        doc = save_unit(attempt, result, written)
        if final.exists():  # an attempt that died after its rename but before returning
            shutil.rmtree(final)
        os.replace(attempt, final)
    finally:
        shutil.rmtree(attempt, ignore_errors=True)
    return unit_result(doc, result.arrays, final, unit)  # what load_unit would read back


def _map_into(
    folder: Path,
    ctx: UnitContext,
    unit: WorkUnit,
    bundle: TokenizerBundle,
    template: ChatTemplate | None,
) -> tuple[UnitResult, dict[str, str]]:
    """Map ``unit`` into ``folder``; return the result and the spill files' SHA-256."""
    # the unit's own inputs only: its codes and counts never repeat the job's input list
    sources = tuple(s.path for s in unit.splits)
    writer = SpillWriter(
        folder, ctx.max_seq_len, ctx.overlong, ctx.split_at_rows, sources, compact=True
    )
    state = SplitRead()
    rejects: list[Reject] = []
    lines: list[np.ndarray] = []
    records = reasoning_dropped = pairs_read = 0
    error = None
    try:
        chunks = ingest(
            list(unit.splits),
            bundle,
            template,
            ctx.options,
            read=lambda s, options: read_split(s, state, options),
            threads=worker_cores(),
        )
        for chunk in chunks:
            records += chunk.records
            rejects += chunk.rejects
            refs = chunk.batch.refs
            every = np.fromiter((r.line for r in refs), np.int64, count=len(refs))
            new = np.ones(len(refs), dtype=bool)  # a record's examples are adjacent; two
            if len(refs) > 1:  # inputs gathered in one unit may both hold a line 1
                new[1:] = np.fromiter(map(ne, refs[1:], refs[:-1]), bool, count=len(refs) - 1)
            lines.append(every[new])
            reasoning_dropped += chunk.reasoning_dropped
            pairs_read += chunk.pairs_read
            rejects += writer.add(chunk.batch)
    except RecordError as exc:  # --on-error fail or --overlong error: the driver decides
        error = (exc.code, exc.reason, exc.source, exc.line)
    spill = writer.finish()
    # each in its smallest integer type (the merge widens): what the driver holds of a unit
    arrays = {name: smallest(getattr(spill, name)) for name in PER_EXAMPLE}
    arrays["lengths"] = smallest(spill.lengths)
    arrays["record_lines"] = smallest(np.concatenate([np.zeros(0, np.int64), *lines]))
    counts = spill.counts
    del spill, lines
    result = UnitResult(
        unit=unit,
        folder=str(folder),
        arrays=arrays,
        counts=counts,
        rejects=tuple(rejects),
        records=records,
        newlines=state.newlines,
        error=error,
        reasoning_dropped=reasoning_dropped,
        pairs_read=pairs_read,
        encode=decided(bundle, ctx.options.backend),
    )
    return result, writer.digests()


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
    folder: Path, result: UnitResult, written: Mapping[str, str] | None = None
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
    arrays: dict[str, Any] = result.arrays
    with open(folder / ARRAYS, "wb") as fh:
        stream = _HashedStream(fh)
        with zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True) as npz:
            for name, values in arrays.items():  # what numpy.savez writes, streamed
                with npz.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(values), allow_pickle=False)
    written = {**(written or {}), ARRAYS: stream.hexdigest()}
    counts = {k: getattr(result.counts, k) for k in SpillCounts.__slots__ if k != "sources"}
    counts["records_per_source"] = list(result.counts.records_per_source)  # its own inputs
    doc: dict[str, Any] = {
        "counts": counts,
        "rejects": [[r.ref.source, r.ref.line, r.domain, r.code, r.reason] for r in result.rejects],
        "records": result.records,
        "newlines": result.newlines,
        "error": None if result.error is None else list(result.error),
        "reasoning_dropped": result.reasoning_dropped,
        "pairs_read": result.pairs_read,
        "encode": result.encode,
        "files": unit_files(folder, written),
    }
    text = json.dumps(doc, ensure_ascii=False)
    tmp = folder / f".{MARKER}.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, folder / MARKER)
    return json.loads(text)


def load_unit(folder: Path, unit: WorkUnit) -> UnitResult:
    """Read back a completed unit (its marker and arrays; never the tokens)."""
    doc = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    with np.load(folder / ARRAYS, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    return unit_result(doc, arrays, folder, unit)


def unit_arrays(result: UnitResult) -> dict[str, np.ndarray]:
    """Return a unit's per-example arrays: those it came back with, else read from its folder.

    The driver lets go of each unit's arrays once it has counted it (:func:`drop_arrays`),
    so that only the unit being merged is in memory, never every unit's at once.
    """
    if result.arrays:
        return result.arrays
    with np.load(Path(result.folder) / ARRAYS, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def unit_examples(result: UnitResult) -> int:
    """Return how many examples a unit spilled (its ``lengths`` read back if dropped)."""
    if result.arrays:
        return int(result.arrays["lengths"].shape[0])
    with np.load(Path(result.folder) / ARRAYS, allow_pickle=False) as npz:
        return int(npz["lengths"].shape[0])


def drop_arrays(result: UnitResult) -> UnitResult:
    """Let go of a unit's per-example arrays (they are in its folder's ``meta.npz``)."""
    result.arrays.clear()
    return result


def unit_result(
    doc: dict[str, Any], arrays: dict[str, np.ndarray], folder: Path, unit: WorkUnit
) -> UnitResult:
    """Return the unit of marker content ``doc`` and ``arrays`` (those ``meta.npz`` holds)."""
    fields: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in doc["counts"].items()
    }
    counts = SpillCounts(**fields)
    rejects = tuple(Reject(SourceRef(s, ln), d, c, why) for s, ln, d, c, why in doc["rejects"])
    error = None if doc["error"] is None else tuple(doc["error"])
    return UnitResult(
        unit=unit,
        folder=str(folder),
        arrays=arrays,
        counts=counts,
        rejects=rejects,
        records=doc["records"],
        newlines=doc["newlines"],
        error=error,
        reasoning_dropped=doc.get("reasoning_dropped", 0),
        pairs_read=doc.get("pairs_read", 0),
        encode=doc.get("encode"),
    )
