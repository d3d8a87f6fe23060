"""Row plans: which example segments go into which packed row, in which order.

:class:`RowPlan` is the one plan type.  The planner
(:func:`packshard.pack.plan.planner.plan_packs`) sees only lengths; :func:`finalize_plan` maps
segments back to spilled examples, numbers split parts, drops parts left without a target and
assigns example ids in input order; :meth:`RowPlan.permute_rows` shuffles rows with the seed.

All operations are vectorised over segment arrays; row ``r`` is the slice
``row_offsets[r]:row_offsets[r + 1]`` of the segment arrays::

    row_offsets  [0, 3, 5]
    seg_example  [7, 2, 9, 4, 1]        segments 0-2 form row 0, 3-4 row 1
    seg_start    [0, 0, 0, 0, 0]        > 0 for the later parts of a cut example
    seg_length   [5, 2, 1, 6, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from packshard.arrays import count_trained, exclusive_cumsum, fill_rate, invert, lower_bound_rows
from packshard.pack.spill import Spill, narrow, smallest

TARGET_BLOCK_TOKENS = 1 << 22
_SEGMENT_FIELDS = (
    "seg_example",
    "seg_start",
    "seg_length",
    "seg_part",
    "seg_targets",
    "example_id",
)


@dataclass(frozen=True, slots=True)
class RowPlan:
    """Packed rows as segment arrays (one entry per segment, rows are contiguous slices).

    Segment arrays are int32 wherever the values fit: 24 bytes a segment.  Straight from the
    planner, ``seg_part``, ``seg_targets`` and ``example_id`` are zeros until
    :func:`finalize_plan` fills them.
    """

    row_offsets: np.ndarray  # int64 [rows + 1]
    seg_example: np.ndarray  # index into the spill (the lengths, from the planner)
    seg_start: np.ndarray  # token offset within the example
    seg_length: np.ndarray  # int32
    seg_part: np.ndarray  # int32, part number of the segment's record
    seg_targets: np.ndarray  # targets in the segment (first label excluded)
    example_id: np.ndarray  # id of the segment in the examples index
    max_seq_len: int
    strategy: str = "bfd"
    examples_dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    parts_dropped: int = 0

    @staticmethod
    def from_segments(
        row_offsets: np.ndarray,
        seg_example: np.ndarray,
        seg_start: np.ndarray,
        seg_length: np.ndarray,
        max_seq_len: int,
        strategy: str,
    ) -> RowPlan:
        """Return a planner's plan: segments laid out in rows, not yet numbered or counted."""
        n = len(seg_example)
        return RowPlan(
            row_offsets,
            seg_example,
            seg_start,
            seg_length,
            np.zeros(n, np.int32),
            np.zeros(n, np.int64),
            np.zeros(n, np.int64),
            max_seq_len,
            strategy,
        )

    @property
    def num_rows(self) -> int:
        """Number of packed rows."""
        return int(self.row_offsets.shape[0]) - 1

    @property
    def num_segments(self) -> int:
        """Number of segments (packed examples or example parts)."""
        return int(self.seg_length.shape[0])

    @property
    def num_tokens(self) -> int:
        """Tokens over all rows."""
        return int(self.seg_length.sum(dtype=np.int64))

    @property
    def lower_bound_rows(self) -> int:
        """⌈tokens / max_seq_len⌉: no packing of these tokens has fewer rows."""
        return lower_bound_rows(self.num_tokens, self.max_seq_len)

    @property
    def fill_rate(self) -> float:
        """Tokens over row capacity, a fraction (:func:`packshard.arrays.fill_rate`)."""
        return fill_rate(self.num_tokens, self.num_rows, self.max_seq_len)

    def row_tokens(self) -> np.ndarray:
        """Tokens in each row (int64)."""
        return self.row_sums(self.seg_length)

    def row_sums(self, values: np.ndarray) -> np.ndarray:
        """Sum of a per-segment array over each row (int64), with no per-segment temporary."""
        whole = values.dtype.kind in "iu" and self.num_rows and self.num_segments
        if whole and (np.diff(self.row_offsets) > 0).all():
            return np.add.reduceat(values, self.row_offsets[:-1], dtype=np.int64)
        ends = exclusive_cumsum(values)  # empty rows (never planned; a hand-made plan)
        return ends[self.row_offsets[1:]] - ends[self.row_offsets[:-1]]

    def segment_rows(self) -> np.ndarray:
        """Row index of each segment (int32 while the rows fit, else int64)."""
        kind = np.int32 if self.num_rows < 2**31 else np.int64
        return np.repeat(np.arange(self.num_rows, dtype=kind), np.diff(self.row_offsets))

    def rows(self, start: int, stop: int) -> RowPlan:
        """Return the sub-plan of rows ``start:stop`` with local row offsets."""
        lo, hi = int(self.row_offsets[start]), int(self.row_offsets[stop])
        return self._take(slice(lo, hi), self.row_offsets[start : stop + 1] - lo)

    def narrowed(self) -> RowPlan:
        """Return the plan with int32 segment arrays wherever the values fit (readers widen)."""
        return replace(self, **_shared(self, narrow, _SEGMENT_FIELDS))

    def without(self, *names: str) -> RowPlan:
        """Return the plan with the segment arrays ``names`` emptied (no later stage reads them).

        Like :meth:`~packshard.pack.spill.Spill.without`: the shards read only the example,
        start, length and id of each segment, so the parts and targets are freed before them.
        """
        dropped: dict[str, Any] = {n: np.zeros(0, getattr(self, n).dtype) for n in names}
        return replace(self, **dropped)

    def compacted(self, *names: str) -> RowPlan:
        """Return the plan with the segment arrays ``names`` in their smallest integer type.

        For the stages that only read them (the index reads each part once; the shards add
        each start to a wide offset).  An array of zeros only (every part and start where no
        example is split) becomes one zero broadcast over the segments: no byte a segment.
        """
        return replace(self, **_shared(self, _compact, names))

    def permute_rows(self, order: np.ndarray, consume: bool = False) -> RowPlan:
        """Reorder rows so that new row ``r`` is old row ``order[r]``.

        ``consume``: the caller gives this plan up, so its segment arrays are reordered in
        place, one at a time through one temporary (never two plans at once).
        """
        counts = np.diff(self.row_offsets)[order]
        new_offsets = exclusive_cumsum(counts)
        kind = np.int32 if self.num_segments < 2**31 else np.int64  # 4 bytes a segment
        gather = np.repeat((self.row_offsets[:-1][order] - new_offsets[:-1]).astype(kind), counts)
        gather += np.arange(int(new_offsets[-1]), dtype=kind)
        if not consume:
            return self._take(gather, new_offsets)
        return replace(
            self, row_offsets=new_offsets, **_shared(self, partial(_moved, gather), _SEGMENT_FIELDS)
        )

    def _take(self, segments: slice | np.ndarray, row_offsets: np.ndarray) -> RowPlan:
        picked = _shared(self, lambda values: values[segments], _SEGMENT_FIELDS)
        return replace(self, row_offsets=row_offsets, **picked)

    @staticmethod
    def concatenate(plans: list[RowPlan]) -> RowPlan:
        """Join finalized plans (e.g. one per domain) row-wise and renumber example ids."""
        bases = exclusive_cumsum(np.array([p.num_segments for p in plans], np.int64)).tolist()
        offsets = [p.row_offsets[1:] + base for p, base in zip(plans, bases[:-1], strict=True)]
        joined: dict[str, Any] = {
            name: np.concatenate([getattr(p, name) for p in plans])
            for name in (*_SEGMENT_FIELDS, "examples_dropped")
        }
        plan = replace(
            plans[0],
            row_offsets=np.concatenate([np.zeros(1, np.int64), *offsets]),
            parts_dropped=sum(p.parts_dropped for p in plans),
            **joined,
        )
        return number_examples(plan)


def _shared(
    plan: RowPlan, change: Callable[[np.ndarray], np.ndarray], names: Sequence[str]
) -> dict[str, Any]:
    """Return ``change`` of each segment array ``names``, an array shared by two fields once.

    A plan whose example ids are its examples holds one array for both, and keeps it so.
    """
    done: dict[int, np.ndarray] = {}
    out: dict[str, Any] = {}
    for name in names:
        values = getattr(plan, name)
        if id(values) not in done:
            done[id(values)] = change(values)
        out[name] = done[id(values)]
    return out


def _compact(values: np.ndarray) -> np.ndarray:
    """Return ``values`` in their smallest type, or one zero broadcast (read only) if all are."""
    small = smallest(values)
    if small.size and small.dtype.kind == "i" and not small.any():
        return np.broadcast_to(np.zeros(1, small.dtype), small.shape)
    return small


def _moved(gather: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Return ``values[gather]``, written over ``values`` itself where it owns its memory."""
    moved = values[gather]
    if values.base is not None or not values.flags.writeable or not values.flags.c_contiguous:
        return moved
    values[...] = moved
    return values


def number_examples(plan: RowPlan) -> RowPlan:
    """Assign example ids in input order: by spilled example, then by start within it."""
    return replace(plan, example_id=invert(np.lexsort((plan.seg_start, plan.seg_example))))


def segment_targets(spill: Spill, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Count targets per token range of the spill (first label of each range excluded).

    Ranges are gathered in blocks of about ``TARGET_BLOCK_TOKENS`` tokens, so memory stays
    bounded whatever the spill's size.
    """
    out = np.zeros(len(lengths), dtype=np.int64)
    csum_len = exclusive_cumsum(lengths)
    lo = 0
    while lo < len(lengths):
        hi = int(np.searchsorted(csum_len, csum_len[lo] + TARGET_BLOCK_TOKENS, side="right"))
        hi = max(hi - 1, lo + 1)
        seg = lengths[lo:hi]
        base = csum_len[lo : hi + 1] - csum_len[lo]
        out[lo:hi] = count_trained(spill.read_ranges(starts[lo:hi], seg)[1], base)
        lo = hi
    return out


def finalize_plan(spill: Spill, raw: RowPlan, index: np.ndarray | None = None) -> RowPlan:
    """Turn a planner's plan over ``spill.lengths[index]`` into a plan over the spill.

    ``index`` None: the planner saw every spilled example once, in input order.  The plan
    comes back narrowed (:meth:`RowPlan.narrowed`: int32 wherever the values fit).
    """
    row_offsets = np.asarray(raw.row_offsets, dtype=np.int64)
    if index is None and raw.strategy == "wrapped":
        index = np.arange(len(spill), dtype=np.int64)
    if raw.strategy != "wrapped":  # each array int32 as it is made: the peak of planning
        seg_ex = narrow(raw.seg_example if index is None else index[raw.seg_example])
        start = smallest(raw.seg_start)  # zeros: one byte a segment
        plan = replace(
            raw,
            row_offsets=row_offsets,
            seg_example=seg_ex,
            seg_start=start,
            seg_length=narrow(raw.seg_length),
            seg_part=smallest(spill.parts[seg_ex]),
            seg_targets=narrow(spill.loss_tokens[seg_ex]),
        )
        del raw
        if not start.any():  # each example once: its rank is its id
            if index is None or _identity(index, len(spill)):
                return replace(plan, example_id=seg_ex).narrowed()
            if _increasing(index):
                return replace(plan, example_id=narrow(np.searchsorted(index, seg_ex))).narrowed()
        return number_examples(plan).narrowed()
    assert index is not None
    seg_example = index[np.asarray(raw.seg_example, dtype=np.int64)]
    seg_start = np.asarray(raw.seg_start, dtype=np.int64)
    seg_length = np.asarray(raw.seg_length, dtype=np.int64)
    # wrapped: an example's segments are consecutive in the plan; number its parts.
    first = np.concatenate(([True], seg_example[1:] != seg_example[:-1]))
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(first)), 0))
    seg_part = (np.arange(len(first)) - group_start).astype(np.int32)
    targets = segment_targets(spill, spill.offsets[seg_example] + seg_start, seg_length)
    keep = targets > 0
    counts = np.bincount(raw.segment_rows()[keep], minlength=raw.num_rows)
    plan = replace(
        raw,
        row_offsets=exclusive_cumsum(counts[counts > 0]),
        seg_example=seg_example[keep],
        seg_start=seg_start[keep],
        seg_length=seg_length[keep],
        seg_part=seg_part[keep],
        seg_targets=targets[keep],
        examples_dropped=np.setdiff1d(seg_example, seg_example[keep]),
        parts_dropped=int((~keep).sum()),
    )
    return number_examples(plan).narrowed()


def _increasing(index: np.ndarray) -> bool:
    """Whether ``index`` is strictly increasing (each example planned once, in input order)."""
    return bool(len(index) < 2 or (np.diff(index) > 0).all())


def _identity(index: np.ndarray, n: int) -> bool:
    """Whether ``index`` is ``0 … n-1`` (checked a block at a time: no temporary of its size).

    Then the plan's example ids are its examples: one array serves as both, and
    :meth:`RowPlan.narrowed` and the row moves keep it shared.
    """
    if len(index) != n or (n and (int(index[0]) != 0 or int(index[-1]) != n - 1)):
        return False
    block = 1 << 20
    return all(
        (np.diff(index[lo : lo + block + 1]) == 1).all() for lo in range(0, max(n - 1, 0), block)
    )


def ordering_stats(plan: RowPlan) -> dict[str, float]:
    """Length-order bias of a plan before shuffling: segments per row, first/last decile."""
    rows = plan.num_rows
    decile = -(-rows // 10)  # at least one row, where there are rows

    def mean_len(lo_row: int, hi_row: int) -> float:
        lo, hi = int(plan.row_offsets[lo_row]), int(plan.row_offsets[hi_row])
        return round(float(plan.seg_length[lo:hi].mean()), 3) if hi > lo else 0.0

    return {
        "segments_per_row_mean": round(plan.num_segments / rows, 4) if rows else 0.0,
        "first_decile_mean_example_len": mean_len(0, decile),
        "last_decile_mean_example_len": mean_len(rows - decile, rows),
    }
