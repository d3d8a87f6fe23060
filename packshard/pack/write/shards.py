"""The write stage: the plan's rows cut into shards, each written by a task of its own.

Shard boundaries come from the plan alone (rows in order, at most ``shard_rows`` rows and
about ``shard_bytes`` each), so they are known before any shard is written, and shard
``k`` is always ``shard-0000k.parquet`` whoever writes it::

    plan rows   [0 ........ 8191][8192 ...... 16383][16384 .. 17000]
    shards       shard-00000      shard-00001        shard-00002
    tasks        write_task(0)    write_task(1)      write_task(2)     any order, any worker

A write task gets its rows' segments (the flat start of each in the spill parts, its
length, its example id), assembles them one row group at a time
(:func:`~packshard.pack.write.assemble.assemble_ranges`) and writes the shard under a name of its
attempt, renamed to the shard's name when complete; it returns the shard's size and
checksum.  Its memory holds its plan slice and two row groups; the driver makes each task
when the engine takes it (:class:`Made`), so it never holds every shard's slice at once.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import overload

import numpy as np
import pyarrow as pa

from packshard.engine import Engine
from packshard.engine.faults import inject
from packshard.engine.heap import BUSY_PAD, pad_heap
from packshard.format.shards import (
    EVAL_SHARD_PATTERN,
    ROW_GROUP_ROWS,
    SHARD_PATTERN,
    ShardInfo,
    write_shard,
)
from packshard.pack.plan.rows import RowPlan
from packshard.pack.spill import Spill, narrow
from packshard.pack.units.columns import release_columns
from packshard.pack.units.parts import PartFiles, read_part_ranges
from packshard.pack.write.assemble import assemble_ranges

BYTES_PER_TOKEN_ESTIMATE = 2.5


def shard_bounds(plan: RowPlan, shard_rows: int, shard_bytes: int) -> list[tuple[int, int]]:
    """Return each shard's rows ``[lo, hi)``: an empty plan still makes one (empty) shard."""
    row_tokens = plan.row_tokens()
    token_budget = max(1, int(shard_bytes / BYTES_PER_TOKEN_ESTIMATE))
    bounds: list[tuple[int, int]] = []
    row = 0
    while row < plan.num_rows or not bounds:
        csum = np.cumsum(row_tokens[row : row + shard_rows])
        take = int(np.searchsorted(csum, token_budget, side="left")) + 1
        take = max(1, min(take, shard_rows, plan.num_rows - row)) if plan.num_rows else 0
        bounds.append((row, row + take))
        row += take
    return bounds


def split_bounds(
    plan: RowPlan, split_at: int, shard_rows: int, shard_bytes: int
) -> tuple[list[tuple[int, int]], list[str]]:
    """Return the shards' rows and names: train rows ``[0, split_at)`` apart from eval rows.

    Without an eval split (``split_at`` is every row) these are :func:`shard_bounds`' shards,
    named ``shard-0000k.parquet``; eval rows make shards ``eval-shard-0000k.parquet`` of their
    own, so no shard holds both splits.
    """
    if split_at == plan.num_rows:
        bounds = shard_bounds(plan, shard_rows, shard_bytes)
        return bounds, [SHARD_PATTERN.format(index=k) for k in range(len(bounds))]
    train = shard_bounds(plan.rows(0, split_at), shard_rows, shard_bytes)
    held = shard_bounds(plan.rows(split_at, plan.num_rows), shard_rows, shard_bytes)
    names = [SHARD_PATTERN.format(index=k) for k in range(len(train))]
    names += [EVAL_SHARD_PATTERN.format(index=k) for k in range(len(held))]
    return train + [(lo + split_at, hi + split_at) for lo, hi in held], names


def shard_entries(shards: list[ShardInfo], split: bool) -> list[dict[str, object]]:
    """Return the manifest's shard entries; with an eval split each names its ``split``."""
    if not split:
        return [s.to_dict() for s in shards]
    kind = EVAL_SHARD_PATTERN.split("{")[0]
    return [
        {**s.to_dict(), "split": "eval" if s.path.startswith(kind) else "train"} for s in shards
    ]


@dataclass(frozen=True, slots=True)
class WriteTask:
    """One shard to write: its rows' segments and where to put it."""

    parts: PartFiles
    folder: str
    name: str
    dataset_id: str
    compression: str
    row_offsets: np.ndarray  # int64 [rows + 1]
    starts: np.ndarray  # int32 while it fits, else int64 [segments]: flat start in the parts
    seg_length: np.ndarray
    example_id: np.ndarray
    max_seq_len: int
    work: str
    faults: tuple[tuple[str, str, int], ...]
    codes: np.ndarray | None  # int8 [segments]: pair codes (a preference pack only)
    multiple: int = 1  # --cp / --pad-multiple: cu_seqlens_padded's segment multiple
    driver: int = 0  # the driver's process id: a task run there keeps no heap pad


PIECE_SEGMENTS = 1 << 16
"""Segments a row group is assembled from at a time: its index temporaries stay this long.

A row group of short examples has many segments (256 rows of one-token examples at
``--max-seq-len 4096``: 1,048,576), and assembling it holds about 100 bytes of temporary
index arrays a segment besides the table itself.  Past this many, the rows are assembled
in pieces of at most this many segments (a row is never cut), each written into the one
table's columns (:func:`~packshard.pack.write.assemble.assemble_ranges` ``cuts``): the same
table, the same bytes, with a piece's temporaries.  Rows of longer examples are one piece.
"""


def piece_cuts(offsets: np.ndarray, start: int, stop: int) -> list[int]:
    """Return the rows ``start = c0 < c1 < … = stop`` that cut rows into pieces to assemble.

    Each piece holds at most :data:`PIECE_SEGMENTS` segments, or one row when a row alone
    has more.
    """
    cuts = [start]
    while cuts[-1] < stop:
        limit = int(offsets[cuts[-1]]) + PIECE_SEGMENTS
        end = int(np.searchsorted(offsets, limit, side="right")) - 1
        cuts.append(min(max(end, cuts[-1] + 1), stop))
    return cuts if len(cuts) > 1 else [start, stop]


def write_task(task: WriteTask) -> ShardInfo:
    """Write one shard from the spill parts (runs in a worker)."""
    inject(task.name, task.faults, Path(task.work) / "_faults")
    # row groups come and go: keep the heap's top (packshard.engine.heap), in a worker; in
    # the driver (--workers 1) the pad would hold each freed row group resident at its peak,
    # and one row group at a time keeps the driver's peak one row group lower
    in_driver = os.getpid() == task.driver
    pad_heap(0 if in_driver else BUSY_PAD)
    read = partial(read_part_ranges, task.parts)

    offsets = task.row_offsets

    def group(start: int, stop: int) -> pa.Table:
        """Rows ``start:stop`` (a row group), assembled a piece of segments at a time."""
        lo, hi = int(offsets[start]), int(offsets[stop])
        none = np.zeros(0, np.int64)
        sub = RowPlan(  # what assembly reads: rows, lengths and ids
            offsets[start : stop + 1] - lo,
            none,
            none,
            task.seg_length[lo:hi],
            none,
            none,
            task.example_id[lo:hi],
            task.max_seq_len,
        )
        codes = task.codes[lo:hi] if task.codes is not None else None
        cuts = [c - start for c in piece_cuts(offsets, start, stop)]
        return assemble_ranges(read, task.starts[lo:hi], sub, codes, cuts)

    def tables() -> Iterator[pa.Table]:
        # one row group's segments at a time: nothing per segment of the whole shard is made
        rows = len(offsets) - 1
        for start in range(0, max(rows, 1), ROW_GROUP_ROWS):
            yield group(start, min(start + ROW_GROUP_ROWS, rows))

    folder = Path(task.folder)
    attempt = f".{task.name}.attempt-{uuid.uuid4().hex[:12]}"
    try:
        pairs = task.codes is not None
        info = write_shard(
            tables(),
            folder,
            attempt,
            task.dataset_id,
            task.compression,
            pairs,
            task.multiple,
            overlap=not in_driver,
        )
        os.replace(folder / attempt, folder / task.name)
    finally:
        (folder / attempt).unlink(missing_ok=True)
    return replace(info, path=task.name)


def write_shards_on(
    engine: Engine,
    folder: Path,
    spill: Spill,
    plan: RowPlan,
    bounds: list[tuple[int, int]],
    dataset_id: str,
    compression: str,
    work: Path,
    faults: tuple[tuple[str, str, int], ...],
    names: list[str],
    meanwhile: Callable[[], None],
    multiple: int = 1,
) -> list[ShardInfo]:
    """Write every shard with ``engine``'s tasks; entries come back in shard order.

    ``names`` are the shards' file names; ``meanwhile`` runs here once the tasks are handed
    out (the engine's ``on_started``); ``multiple`` > 1 adds ``cu_seqlens_padded``.
    """
    assert spill.part_files is not None, "tasks read the work units' spill parts"
    codes = spill.pair_codes if spill.pair_codes is not None and spill.pair_codes.any() else None
    parts, offsets = spill.part_files, spill.offsets

    def task(k: int) -> WriteTask:
        lo, hi = bounds[k]
        sub = plan.rows(lo, hi)
        starts = offsets[sub.seg_example]
        starts += sub.seg_start  # in place: no second array of the shard's segments
        made = WriteTask(
            parts=parts,
            folder=str(folder),
            name=names[k],
            dataset_id=dataset_id,
            compression=compression,
            row_offsets=sub.row_offsets,
            starts=narrow(starts),
            seg_length=sub.seg_length,
            example_id=sub.example_id,
            max_seq_len=plan.max_seq_len,
            work=str(work),
            faults=faults,
            codes=codes[sub.seg_example] if codes is not None else None,
            multiple=multiple,
            driver=os.getpid(),
        )
        release_columns(spill)  # the offsets' pages this task's starts read (mapped)
        return made

    return engine.run(write_task, Made(task, len(bounds)), names, on_started=meanwhile)


class Made(Sequence[WriteTask]):
    """The write tasks, each made when the engine takes it and not kept.

    Every engine takes its tasks one index at a time (a retry takes it again): so only the
    tasks in flight hold their segments' flat starts (4 or 8 bytes a segment), never every
    shard's at once.
    """

    def __init__(self, make: Callable[[int], WriteTask], count: int) -> None:
        self._make, self._count = make, count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> WriteTask: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[WriteTask]: ...
    def __getitem__(self, index: int | slice) -> WriteTask | Sequence[WriteTask]:
        if isinstance(index, slice):
            return [self._make(k) for k in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(index)
        return self._make(index % self._count)
