"""The parent's tokens: its shards read once, checked, each segment copied to its new place.

Two layouts, one scatter (:func:`scatter_parent`)::

    shards, a row group at a time ─► checked: SHA-256, columns, seams, and against the
                                      index: each segment's length and targets, ids once
        each segment ─► place[its example] in work/parent/tokens.bin (labels.bin), its
                        targets counted on the way (one jitted pass: scatter_segments)
    place = where the new plan writes it   (:func:`lay_out`, every example whole)
            the new shards' tokens in their order: a row group is one contiguous read;
            each label folded into its token (tokens.bin alone: PartFiles.folded)
    place = offsets by example id           (:func:`parent_tokens`, for the spill writer)

Measured on 1,000,000 chat examples (23.0M phi-3 tokens, ``scripts/bench_repack.py``, one
process, a 2-core machine at load 3-5): the scatter pass takes 1.3-1.6 CPU-s, about half of
it Parquet's decode, where reading each whole shard and then gathering by id (two passes)
took 4.3.  Laid out in the new order, the shard writer's reads of the tokens went from
10^5 scattered ranges a row group to one slice, and its stage from 3.2 to 1.9 CPU-s.  The
scatter writes into files mapped for writing: arrays in memory written out once were no
cheaper (their faults are fewer, as huge pages, but each costs more), nor was a mapping
populated when made (``MAP_POPULATE``).  Copying both columns and counting each segment's
targets in one jitted pass, where a copy a column and ``count_trained`` took three, took
the pass from 1.6-1.7 to 1.0-1.4 CPU-s (the stage alone, five times in one process).
Folding the labels into the tokens halves what the scatter writes (92 MB where 184 MB were:
22,500 page faults where 45,000 were, the scatter 0.19-0.24 CPU-s where 0.33 was) and what
the shard writer reads back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from numba import njit

from packshard.arrays import exclusive_cumsum
from packshard.errors import FormatError
from packshard.export.common import COLUMNS, read_rows
from packshard.pack.plan.rows import RowPlan
from packshard.pack.spill import Spill
from packshard.pack.units.parts import FILES, PartFiles
from packshard.records import IGNORE_INDEX


@dataclass(frozen=True)
class StoredTokens:
    """The parent's tokens and labels in example-id order (pass 1), with their counts."""

    folder: Path  # tokens.bin, labels.bin: flat int32, example 0's tokens first (not folded)
    offsets: np.ndarray  # int64 [n + 1]
    loss_tokens: np.ndarray  # int32 [n]: targets, each example's first label excluded

    @property
    def part_files(self) -> PartFiles:
        """The files as the spill's one part."""
        return PartFiles((str(self.folder),), self.offsets[[0, -1]])

    @property
    def length(self) -> np.ndarray:
        """Each example's token count (int64)."""
        return np.diff(self.offsets)

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return the tokens, labels and offsets of examples ``lo … hi - 1``: one slice each."""
        start, stop = int(self.offsets[lo]), int(self.offsets[hi])
        out = []
        for name in FILES:
            values = np.fromfile(self.folder / name, np.int32, count=stop - start, offset=4 * start)
            if values.size < stop - start:
                raise EOFError(f"{self.folder / name}: ends early")
            out.append(values)
        return out[0], out[1], self.offsets[lo : hi + 1] - start


def parent_tokens(
    parent: Path, folder: Path, lengths: np.ndarray, targets: np.ndarray
) -> StoredTokens:
    """Pass 1: every shard's segments copied to their example's place in ``folder``'s files.

    ``lengths`` (the index's ``num_tokens``, by example id) place each example before any
    shard is read (:func:`scatter_parent` checks every shard against the index as it is read).
    """
    offsets = exclusive_cumsum(lengths)
    scatter_parent(parent, folder, lengths, targets, offsets[:-1], int(offsets[-1]))
    return StoredTokens(folder, offsets, targets.astype(np.int32))


def lay_out(
    parent: Path,
    folder: Path,
    lengths: np.ndarray,
    targets: np.ndarray,
    spill: Spill,
    plan: RowPlan,
) -> Spill:
    """Read the parent's tokens into the order ``plan`` writes them; return the shards' spill.

    Segment ``j`` of the plan (rows in order, shards after one another) starts at the sum of
    the lengths before it, so the new shards' row groups are consecutive slices of
    ``folder``'s files.  Every example is whole (``seg_start`` 0); one planned twice
    (``--mix``) is read once, at its first place, and both segments read it there.  The
    returned spill's ``offsets[e]`` is where example ``e`` starts in those files (-1: not
    planned), all that the shard writer reads of it.  The parent is checked as it is read
    (:func:`scatter_parent`).
    """
    if plan.seg_start.any():
        raise AssertionError("lay_out takes whole examples only")
    at = exclusive_cumsum(plan.seg_length.astype(np.int64))
    place = np.full(len(lengths), -1, np.int64)
    place[plan.seg_example[::-1]] = at[:-1][::-1]  # a repeated example at its first place
    scatter_parent(parent, folder, lengths, targets, place, int(at[-1]), folded=True)
    part = PartFiles((str(folder),), np.array([0, int(at[-1])], np.int64), folded=True)
    return replace(spill, part_files=part, offsets=place)


def scatter_parent(
    parent: Path,
    folder: Path,
    lengths: np.ndarray,
    targets: np.ndarray,
    place: np.ndarray,
    total: int,
    folded: bool = False,
) -> None:
    """Copy every shard segment of ``parent`` to ``place[its example]`` of ``folder``'s files.

    ``folded``: ``tokens.bin`` alone, each label folded into its token
    (:func:`~packshard.pack.units.parts.unfold_labels` splits them), else ``labels.bin`` too.

    Each shard is read one row group at a time and checked as it is read (its SHA-256,
    dataset id, columns and seams: :func:`packshard.export.common.read_rows`); every segment
    must be as long, and train as many labels (its first excluded), as the index says, and
    every example id must appear once.  An example whose place is -1 is checked, not copied.
    """
    folder.mkdir(parents=True)
    examples = len(lengths)
    seen = np.zeros(examples, np.bool_)
    none = np.zeros(0, np.int32)  # an empty file, or no labels file when folded
    files = [_mapped(folder / name, total) for name in (FILES[:1] if folded else FILES)]
    out = [none if f is None else f for f in files]
    out_ids, out_labels = out[0], out[1] if len(out) > 1 else none
    for rows in read_rows(parent, ("train", "eval"), COLUMNS, by_group=True):
        ids = rows.example_ids
        if ids.size and (ids.min() < 0 or ids.max() >= examples or seen[ids].any()):
            raise FormatError(str(parent), "an example id is repeated or not in the index")
        if not np.array_equal(rows.seg_len, lengths[ids]):
            raise FormatError(
                str(parent), "a shard's segment and the examples index disagree on its length"
            )
        seen[ids] = True
        trained = np.empty(len(ids), np.int64)
        scatter_segments(
            rows.ids,
            rows.labels,
            rows.seg_starts(),
            rows.seg_len,
            place[ids],
            out_ids,
            out_labels,
            trained,
            folded,
        )
        if not np.array_equal(trained, targets[ids]):
            bad = int(np.flatnonzero(trained != targets[ids])[0])
            raise FormatError(
                str(parent),
                f"example {int(ids[bad])}: its shard's labels and the examples index disagree "
                f"on its targets ({int(trained[bad])} vs {int(targets[ids[bad]])})",
            )
    # unmapped, unsynced: the pages stay in the page cache for the shard writer
    del files, out, out_ids, out_labels
    if not seen.all():
        missing = int(np.flatnonzero(~seen)[0])
        raise FormatError(str(parent), f"example {missing} of the index is in no shard")


def _mapped(path: Path, size: int) -> np.memmap | None:
    """Create ``path`` as ``size`` int32 and map it for writing (None: an empty file)."""
    if not size:
        path.touch()
        return None
    return np.memmap(path, dtype=np.int32, mode="w+", shape=(size,))


@njit(cache=True, nogil=True)
def scatter_segments(  # pragma: no cover - jitted
    ids: np.ndarray,
    labels: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    at: np.ndarray,
    out_ids: np.ndarray,
    out_labels: np.ndarray,
    trained: np.ndarray,
    folded: bool = False,
) -> None:
    """Copy segment ``i`` (``starts[i]``, ``lengths[i]``) of both columns to ``at[i]``.

    ``at[i]`` -1 copies nothing.  ``trained[i]`` is the segment's labels other than
    ``IGNORE_INDEX``, its first left out (:func:`~packshard.arrays.count_trained`).
    ``folded``: each label folded into its token in ``out_ids`` (the token where it trains,
    else ``~token``: :func:`~packshard.pack.units.parts.unfold_labels`), ``out_labels``
    unused; the labels must be ``IGNORE_INDEX`` or their token, as the shards' checks make
    sure before this runs.
    """
    for i in range(len(starts)):
        src, dst, n = starts[i], at[i], lengths[i]
        count = 0
        for j in range(1, n):
            if labels[src + j] != IGNORE_INDEX:
                count += 1
        trained[i] = count
        if dst >= 0 and folded:
            for j in range(n):
                token = ids[src + j]
                out_ids[dst + j] = token if labels[src + j] != IGNORE_INDEX else ~token
        elif dst >= 0:
            for j in range(n):
                out_ids[dst + j] = ids[src + j]
                out_labels[dst + j] = labels[src + j]
