"""Work units of the inputs: byte ranges of JSONL, row groups of Parquet, whole other files.

The driver cuts every input into deterministic ranges before any worker starts; a range's
identity is its input's index and its range, never who runs it::

    chat.jsonl   [0 ──────── 4 MiB)[4 MiB ─────── 8 MiB)[8 MiB ── 9.5 MiB)   byte ranges,
                  ^ line start      ^ line start          ^ line start         cut at line starts
    rows.parquet [groups 0–3][groups 4–5]                                      whole row groups
    big.json.gz  [whole file]                                                  cannot be cut

A JSONL cut point is the first line start at or after each ``target_bytes`` boundary (never a
line that begins with a byte order mark).  A range gives exactly the records, rejects and
reasons the whole file gives.  Its lines are numbered from 1 at its start; the driver adds
the lines of the earlier ranges (:attr:`RangeRead.newlines`), so every ``file:line`` is
absolute without a pass over the file first.  Parquet rows are numbered from the footer.

Objects in a store (:attr:`~packshard.ingest.read.inputs.InputFile.in_store`) are cut by
their sizes alone, in nominal ranges ``[k × target, (k + 1) × target)``; the worker mapping
one moves each end to the first usable line start at or after it (the same rule), in ranged
reads on its node, so adjacent ranges agree and every line is read once (a range holding no
line start is empty).  A Parquet object's ranges come from its footer (metadata only)::

    s3://b/chat.jsonl  [0 ──── T)[T ──── 2T)[2T ─ size)   worker of [T, 2T): line start ≥ T … ≥ 2T

Small inputs are gathered (:func:`plan_units`): a work unit is one range, or a run of
consecutive inputs that are each one range (read whole) and together no larger than the
unit size::

    a.jsonl (3 KB)  b.jsonl (5 KB)  c.jsonl (2 KB) │ big.jsonl [0 ── 16 MiB)[16 MiB ── 20 MiB)
    └──────── one unit: 00000-inputs-00002 ───────┘ └─ one unit each ──┘└────────────────┘

A unit pays a fixed cost (a task, a spill folder, a marker), so small inputs share one
(``docs/performance.md``, "Many small inputs"); records and order, hence the output, are the
same however inputs are gathered.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from packshard.errors import InputError
from packshard.ingest.read.inputs import open_stored, split_ext
from packshard.ingest.read.parquet import parquet_records
from packshard.ingest.read.regular import open_regular_fd
from packshard.ingest.read.sources import (
    CHUNK_SIZE,
    InputFile,
    read_jsonl,
    read_records,
)
from packshard.ingest.types import IngestOptions, RawRecord
from packshard.store.objects import store_errors
from packshard.store.urls import is_url

SPLIT_BYTES = 64 * 1024 * 1024
"""The largest unit :func:`auto_split_bytes` makes (bytes of JSONL; Parquet row groups are
gathered up to about this)."""
MIN_SPLIT_BYTES = 16 * 1024 * 1024
"""The smallest unit :func:`auto_split_bytes` makes: each unit pays a pipeline fill and drain
(its first records encoded in small pieces, its last ones waited for), about 25 ms of wall
time on 2 cores.  Measured with phi-3 on the shared chat data repeated, one process, whole
``pack``: 19 MB in 1 MiB units 3.52–3.65 s, in one 16 MiB unit 3.11–3.30 s (−10%); 72 MB in
69 units 10.6–12.8 s, in 5 units 9.2–10.8 s (−15%); with two workers on 72 MB, 7.9–9.5 s
against 7.3–8.9 s.  The bytes are the same whatever the unit size."""
UNITS_WANTED = 64
"""Units :func:`auto_split_bytes` aims at: enough to keep 16 workers busy to the end."""
_BOM = b"\xef\xbb\xbf"
KINDS = ("bytes", "rows", "file")


@dataclass(frozen=True, slots=True)
class InputRange:
    """One range of an input: input ``index``, and ``[start, stop)`` in bytes or row groups.

    ``kind`` is ``bytes`` (JSONL), ``rows`` (Parquet row groups from 0-based row
    ``first_row``) or ``file``.  ``size`` is its share of the input's bytes (what progress
    counts).
    """

    index: int
    path: str
    real: str
    kind: str
    start: int = 0
    stop: int = 0
    first_row: int = 0
    size: int = 0
    total: int = 0  # the whole input's bytes: where a store range's last line may end

    def describe(self) -> str:
        """Name the unit for people: ``chat.jsonl bytes 0–4194304``."""
        if self.kind == "bytes":
            return f"{self.path} bytes {self.start}–{self.stop}"
        if self.kind == "rows":
            return f"{self.path} row groups {self.start}–{self.stop - 1}"
        return f"{self.path} (whole file)"

    @property
    def name(self) -> str:
        """A file-name-safe identity: ``00003-bytes-0-4194304``."""
        return f"{self.index:05d}-{self.kind}-{self.start}-{self.stop}"

    @property
    def in_store(self) -> bool:
        """Whether the split's input is a store object (``real`` is then its URL)."""
        return is_url(self.real)

    @property
    def input(self) -> InputFile:
        """The input file this split reads."""
        stored = self.total if self.in_store else None
        return InputFile(self.path, Path(self.real), stored)


def auto_split_bytes(files: Sequence[InputFile]) -> int:
    """Return the unit size when none is given: the inputs' bytes over 64, within 16–64 MiB.

    It depends on the inputs alone, never on the workers, so that a ``--resume`` with other
    workers keeps the units.  Inputs under 16 MiB are one unit (:data:`MIN_SPLIT_BYTES`).
    """
    return _unit_bytes(input_bytes(files))


def _unit_bytes(total: int) -> int:
    """Return the unit size :func:`auto_split_bytes` gives inputs of ``total`` bytes."""
    return min(SPLIT_BYTES, max(MIN_SPLIT_BYTES, -(-total // UNITS_WANTED)))


def input_bytes(files: Sequence[InputFile]) -> int:
    """Sum the bytes of the regular files among ``files`` (one that cannot be read: 0)."""
    return sum(file_bytes(f) for f in files)


def file_bytes(f: InputFile) -> int:
    """Return the bytes of ``f`` if a regular file; 0 otherwise, or when it cannot be read."""
    if f.stored_size is not None:
        return f.stored_size
    try:
        st = os.stat(f.real)
    except OSError:
        return 0  # plan_ranges names it
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def plan_ranges(files: Sequence[InputFile], target_bytes: int = 0) -> list[InputRange]:
    """Cut ``files`` into ranges of about ``target_bytes`` (0: :func:`auto_split_bytes`)."""
    return _cut(files, target_bytes)[0]


def _cut(files: Sequence[InputFile], target_bytes: int) -> tuple[list[InputRange], int]:
    """:func:`plan_ranges`, and the unit size it cut by: every input ``stat``-ed once."""
    sizes: list[int | None] = []  # None: not a regular file
    for f in files:
        if f.stored_size is not None:
            sizes.append(f.stored_size)
            continue
        try:
            st = os.stat(f.real)
        except OSError as exc:
            raise InputError(f"{f.path}: cannot open ({exc.strerror or exc})") from None
        sizes.append(st.st_size if stat.S_ISREG(st.st_mode) else None)
    if target_bytes <= 0:  # auto_split_bytes, from the sizes in hand
        target_bytes = _unit_bytes(sum(n or 0 for n in sizes))
    ranges: list[InputRange] = []
    for index, (f, n) in enumerate(zip(files, sizes, strict=True)):
        _, kind, codec = split_ext(os.path.basename(f.path))
        size = n or 0
        real = f.path if f.in_store else str(f.real)
        whole = InputRange(index, f.path, real, "file", size=size, total=size)
        if n is None or codec or kind == ".json":
            ranges.append(whole)
        elif kind == ".parquet":
            ranges.extend(_row_group_ranges(index, f, target_bytes, size) or [whole])
        else:
            if f.in_store:  # nominal: the worker finds the line starts (module docstring)
                cuts = [*(range(0, size, target_bytes) or [0]), size]
            else:
                cuts = _line_cuts(f.real, size, target_bytes)
            for lo, hi in pairwise(cuts):
                ranges.append(
                    InputRange(index, f.path, real, "bytes", lo, hi, size=hi - lo, total=size)
                )
    return ranges, target_bytes


def _line_cuts(path: Path, size: int, target: int) -> list[int]:
    """``[0, c1, …, size]``: each cut the first usable line start at or after a boundary."""
    cuts = [0]
    if target >= size:  # one range: the file is not opened
        return [0, size]
    with open(path, "rb") as fh:
        while cuts[-1] + target < size:
            at = _next_line_start(fh, cuts[-1] + target, size)
            if at >= size:
                break
            cuts.append(at)
    cuts.append(size)
    return cuts


def _next_line_start(fh: Any, pos: int, size: int) -> int:
    """Return the first offset >= ``pos`` after a newline that does not start with a BOM."""
    at = pos - 1
    while at < size:
        fh.seek(at)
        piece = fh.read(1 << 16)
        if not piece:
            break
        nl = piece.find(b"\n")
        if nl < 0:
            at += len(piece)
            continue
        start = at + nl + 1
        fh.seek(start)
        if fh.read(len(_BOM)) != _BOM:
            return start
        at = start
    return size


def _row_group_ranges(index: int, f: InputFile, target: int, file_size: int) -> list[InputRange]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if f.in_store:  # the footer alone, in ranged reads
            with open_stored(f) as handle:
                meta = pq.ParquetFile(handle).metadata
        else:
            meta = pq.ParquetFile(f.real).metadata
    except (OSError, pa.ArrowException, InputError):
        return []  # read whole: the reader reports the problem
    ranges: list[InputRange] = []
    lo = row = first = size = data = shown = 0
    total = max(1, sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)))
    for g in range(meta.num_row_groups):
        size += meta.row_group(g).total_byte_size
        data += meta.row_group(g).total_byte_size
        row += meta.row_group(g).num_rows
        if size >= target or g == meta.num_row_groups - 1:
            share = file_size * data // total - shown  # the last one ends at the file's size
            real = f.path if f.in_store else str(f.real)
            ranges.append(
                InputRange(index, f.path, real, "rows", lo, g + 1, first, share, file_size)
            )
            lo, first, size, shown = g + 1, row, 0, shown + share
    return ranges


@dataclass
class RangeRead:
    """Counts a reader learns while it reads a split (filled in as records are yielded)."""

    newlines: int = 0  # b"\n" bytes in a byte range: the lines it holds


def read_range(
    split: InputRange, state: RangeRead | None = None, options: IngestOptions | None = None
) -> Iterator[RawRecord]:
    """Stream the records of one range, in file order (lines relative for ``bytes`` ranges).

    The limits of ``options`` apply as they do to the whole file (:func:`read_records`).
    """
    state = state if state is not None else RangeRead()
    options = options or IngestOptions()
    limit = options.max_record_bytes
    f = split.input
    if split.kind == "file":
        yield from read_records(f, options=options)
    elif split.kind == "rows":  # rows numbered from the split's first, as the whole file's
        groups = range(split.start, split.stop)
        if split.in_store:
            with open_stored(f) as handle:
                yield from parquet_records(f, handle, 1024, limit, groups, split.first_row)
        else:
            yield from parquet_records(f, f.real, 1024, limit, groups, split.first_row)
    elif split.in_store:  # a nominal range: its bounds found here, where it is read
        with open_stored(f) as handle:
            with store_errors(split.path, f"find the lines of bytes {split.start}–{split.stop}"):
                start = split.start and _next_line_start(handle, split.start, split.total)
                stop = split.total
                if split.stop < split.total:
                    stop = _next_line_start(handle, split.stop, split.total)

            def read(n: int, at: int) -> Any:
                with store_errors(split.path, f"read bytes {at}–{at + n}"):
                    return handle.read_at(n, at)

            yield from read_jsonl(f, _range_bytes(read, split, state, start, stop), limit)
    else:
        fd = open_regular_fd(split.real, f.path)
        try:
            chunks = _range_bytes(_preader(fd), split, state, split.start, split.stop)
            yield from read_jsonl(f, chunks, limit)
        finally:
            os.close(fd)


def count_newlines(split: InputRange) -> int:
    """Return the lines a ``bytes`` split holds (its newline bytes), read without parsing."""
    state = RangeRead()
    fd = open_regular_fd(split.real, split.path)
    try:
        for _ in _range_bytes(_preader(fd), split, state, split.start, split.stop):
            pass
    finally:
        os.close(fd)
    return state.newlines


def _preader(fd: int) -> Callable[[int, int], bytes]:
    """``read(n, at)`` of a local file: ``os.pread`` on its descriptor."""
    return lambda n, at: os.pread(fd, n, at)


def _range_bytes(
    read: Callable[[int, int], Any], split: InputRange, state: RangeRead, at: int, stop: int
) -> Iterator[bytes]:
    """Yield the bytes ``[at, stop)`` of ``split``'s input, at most ``CHUNK_SIZE`` a piece.

    ``read(n, offset)`` reads a local file with ``os.pread`` (no buffered file object), or a
    store object with one ranged request.
    """
    while at < stop:
        chunk = bytes(read(min(CHUNK_SIZE, stop - at), at))
        if not chunk:
            raise InputError(
                f"{split.path}: file ended at byte {at}, expected {stop} (it changed while "
                "it was packed: pack it again once it is written)"
            )
        state.newlines += chunk.count(b"\n")
        at += len(chunk)
        yield chunk


@dataclass(frozen=True, slots=True)
class WorkUnit:
    """One task's input: one range, or several whole inputs in a row (:func:`plan_units`)."""

    ranges: tuple[InputRange, ...]

    @property
    def gathered(self) -> bool:
        """Whether the unit holds several whole inputs (else one range)."""
        return len(self.ranges) > 1

    @property
    def name(self) -> str:
        """A file-name-safe identity: the split's, or ``00003-inputs-00010`` (first, last)."""
        first, last = self.ranges[0], self.ranges[-1]
        return f"{first.index:05d}-inputs-{last.index:05d}" if self.gathered else first.name

    @property
    def size(self) -> int:
        """The input bytes the unit reads (what progress counts)."""
        return sum(s.size for s in self.ranges)

    def describe(self) -> str:
        """Name the unit for people: the range's name, or its first and last inputs."""
        first, last = self.ranges[0], self.ranges[-1]
        if not self.gathered:
            return first.describe()
        return f"{first.path} … {last.path} ({len(self.ranges)} whole inputs)"


def plan_units(files: Sequence[InputFile], target_bytes: int = 0) -> list[WorkUnit]:
    """Cut ``files`` into ranges (:func:`plan_ranges`), then gather the small whole inputs.

    A whole small input joins the run of such inputs before it while their bytes stay within
    the unit size; any other split is a unit of its own.  Units depend on the inputs and the
    unit size alone.
    """
    ranges, target_bytes = _cut(files, target_bytes)
    per_input = Counter(s.index for s in ranges)
    units: list[WorkUnit] = []
    run: list[InputRange] = []
    paths: set[str] = set()
    size = 0
    for s in ranges:
        whole = per_input[s.index] == 1 and s.size < target_bytes
        if run and (not whole or size + s.size > target_bytes or s.path in paths):
            units.append(WorkUnit(tuple(run)))
            run, paths, size = [], set(), 0
        if whole:
            run.append(s)
            paths.add(s.path)
            size += s.size
        else:
            units.append(WorkUnit((s,)))
    if run:
        units.append(WorkUnit(tuple(run)))
    return units
