"""A unit's spill part as stored: what a map task keeps, written once and read back.

A map task (:mod:`packshard.pack.units.map`) leaves each unit's part in its own folder of
the work folder; this module owns what that folder holds beside the spill's token files::

    00003-bytes-0-4194304/
      tokens.bin, labels.bin    the spill's (written by SpillWriter, hashed as written)
      meta.npz                  the per-example integers, each in its smallest type
      unit.json                 counts, rejects, what ingest read, every file's SHA-256;
                                written last: the unit's completion marker

The driver reads parts back by these functions alone, so it needs none of the ingest that
made them.  ``meta.npz`` is what ``numpy.savez`` writes, streamed through a hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from packshard.digests import sha256_path
from packshard.ingest import UnitError, UnitRead, UnitResult, WorkUnit
from packshard.pack.spill import SpillCounts
from packshard.records import Reject, SourceRef

MARKER = "unit.json"
ARRAYS = "meta.npz"


@dataclass(frozen=True, slots=True)
class SpillPart:
    """What a map task keeps of its unit: the per-example integers, counts and rejects.

    ``arrays`` holds ``lengths``, the spill's per-example arrays (lines and codes local to the
    unit) and ``record_lines`` (every accepted record's line); ``folder`` is the unit's part.
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

    It can neither tell nor seek, so the zip writer writes each member once, front to back,
    and the bytes hashed are the file's; no copy of the arrays is made in memory.
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

    The marker records every file's SHA-256 for ``--resume``: ``written`` gives the spill
    files', and the arrays are hashed as written (:class:`_HashedStream`), so no file is read
    back.  Returns the marker's content, as read back.
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
