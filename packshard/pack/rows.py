"""Row plans: which example segments go into which packed row, in which order.

The planner (``packing.plan_packs``) sees only lengths and returns rows of segments.  This
module turns that raw plan into the writer's :class:`RowPlan`: it maps segments back to spilled
examples, numbers the parts of split examples, drops parts left without a target (possible
when ``wrapped`` cuts an example so that its only target becomes a masked segment start),
assigns example ids in input order, measures the length-order bias, and permutes rows with
the seed so that training order is not sorted by length.

All operations are vectorised over segment arrays; a row is the slice
``row_offsets[r]:row_offsets[r+1]`` of the segment arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from packshard.records import IGNORE_INDEX
from packshard.pack.spill import Spill

TARGET_BLOCK_TOKENS = 1 << 22


@dataclass(frozen=True, slots=True)
class RowPlan:
    """Packed rows as segment arrays (one entry per segment, rows are contiguous slices)."""

    row_offsets: np.ndarray  # int64 [rows + 1]
    seg_example: np.ndarray  # int64, index into the spill
    seg_start: np.ndarray  # int64, token offset within the spilled example
    seg_length: np.ndarray  # int64
    seg_part: np.ndarray  # int32, part number of the segment's record
    seg_targets: np.ndarray  # int64, targets in the segment (first label excluded)
    example_id: np.ndarray  # int64, id of the segment in the examples index
    examples_dropped: np.ndarray  # int64, spill examples none of whose parts survived
    parts_dropped: int = 0

    @property
    def num_rows(self) -> int:
        """Number of packed rows."""
        return int(self.row_offsets.shape[0]) - 1

    @property
    def num_segments(self) -> int:
        """Number of segments (packed examples or example parts)."""
        return int(self.seg_length.shape[0])

    def row_tokens(self) -> np.ndarray:
        """Tokens in each row (int64)."""
        if self.num_rows == 0:
            return np.zeros(0, dtype=np.int64)
        return np.add.reduceat(self.seg_length, self.row_offsets[:-1])

    def segment_rows(self) -> np.ndarray:
        """Row index of each segment (int64)."""
        return np.repeat(np.arange(self.num_rows, dtype=np.int64), np.diff(self.row_offsets))

    def rows(self, start: int, stop: int) -> RowPlan:
        """Return the sub-plan of rows ``start:stop`` with local row offsets."""
        lo, hi = int(self.row_offsets[start]), int(self.row_offsets[stop])
        return replace(
            self,
            row_offsets=self.row_offsets[start : stop + 1] - lo,
            seg_example=self.seg_example[lo:hi],
            seg_start=self.seg_start[lo:hi],
            seg_length=self.seg_length[lo:hi],
            seg_part=self.seg_part[lo:hi],
            seg_targets=self.seg_targets[lo:hi],
            example_id=self.example_id[lo:hi],
        )

    def permute_rows(self, order: np.ndarray) -> RowPlan:
        """Reorder rows so that new row ``r`` is old row ``order[r]``."""
        counts = np.diff(self.row_offsets)[order]
        new_offsets = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(counts, out=new_offsets[1:])
        gather = np.repeat(self.row_offsets[:-1][order] - new_offsets[:-1], counts)
        gather += np.arange(int(new_offsets[-1]), dtype=np.int64)
        return self._take(gather, new_offsets)

    def _take(self, gather: np.ndarray, row_offsets: np.ndarray) -> RowPlan:
        return replace(
            self,
            row_offsets=row_offsets,
            seg_example=self.seg_example[gather],
            seg_start=self.seg_start[gather],
            seg_length=self.seg_length[gather],
            seg_part=self.seg_part[gather],
            seg_targets=self.seg_targets[gather],
            example_id=self.example_id[gather],
        )

    @staticmethod
    def concatenate(plans: list[RowPlan]) -> RowPlan:
        """Join plans (e.g. one per domain) row-wise and renumber example ids."""
        offsets = [np.zeros(1, dtype=np.int64)]
        base = 0
        for p in plans:
            offsets.append(p.row_offsets[1:] + base)
            base += p.num_segments
        joined = RowPlan(
            row_offsets=np.concatenate(offsets),
            seg_example=np.concatenate([p.seg_example for p in plans]),
            seg_start=np.concatenate([p.seg_start for p in plans]),
            seg_length=np.concatenate([p.seg_length for p in plans]),
            seg_part=np.concatenate([p.seg_part for p in plans]),
            seg_targets=np.concatenate([p.seg_targets for p in plans]),
            example_id=np.zeros(sum(p.num_segments for p in plans), dtype=np.int64),
            examples_dropped=np.concatenate([p.examples_dropped for p in plans]),
            parts_dropped=sum(p.parts_dropped for p in plans),
        )
        return number_examples(joined)


def number_examples(plan: RowPlan) -> RowPlan:
    """Assign example ids in input order: by spilled example, then by start within it."""
    order = np.lexsort((plan.seg_start, plan.seg_example))
    ids = np.empty(plan.num_segments, dtype=np.int64)
    ids[order] = np.arange(plan.num_segments, dtype=np.int64)
    return replace(plan, example_id=ids)


def segment_targets(spill: Spill, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Count targets per token range of the spill (first label of each range excluded)."""
    out = np.zeros(len(lengths), dtype=np.int64)
    csum_len = np.concatenate(([0], np.cumsum(lengths)))
    lo = 0
    while lo < len(lengths):
        hi = int(np.searchsorted(csum_len, csum_len[lo] + TARGET_BLOCK_TOKENS, side="right"))
        hi = max(hi - 1, lo + 1)
        seg = lengths[lo:hi]
        base = csum_len[lo:hi] - csum_len[lo]
        gather = np.repeat(starts[lo:hi] - base, seg) + np.arange(int(seg.sum()))
        is_target = np.asarray(spill.labels[gather] != IGNORE_INDEX, dtype=np.int64)
        is_target[base] = 0
        out[lo:hi] = np.add.reduceat(is_target, base) if len(seg) else 0
        spill.release_pages()
        lo = hi
    return out


def finalize_plan(spill: Spill, raw: object, index: np.ndarray, strategy: str) -> RowPlan:
    """Turn a planner result over ``spill.lengths[index]`` into a :class:`RowPlan`."""
    row_offsets = np.asarray(raw.row_offsets, dtype=np.int64)  # type: ignore[attr-defined]
    seg_example = index[np.asarray(raw.seg_example, dtype=np.int64)]  # type: ignore[attr-defined]
    seg_start = np.asarray(raw.seg_start, dtype=np.int64)  # type: ignore[attr-defined]
    seg_length = np.asarray(raw.seg_length, dtype=np.int64)  # type: ignore[attr-defined]
    if strategy != "wrapped":
        plan = RowPlan(
            row_offsets=row_offsets,
            seg_example=seg_example,
            seg_start=seg_start,
            seg_length=seg_length,
            seg_part=spill.parts[seg_example].astype(np.int32),
            seg_targets=spill.loss_tokens[seg_example].astype(np.int64),
            example_id=np.zeros(len(seg_example), dtype=np.int64),
            examples_dropped=np.zeros(0, dtype=np.int64),
        )
        return number_examples(plan)
    # wrapped: an example's segments are consecutive in the plan; number its parts.
    first = np.concatenate(([True], seg_example[1:] != seg_example[:-1]))
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(first)), 0))
    seg_part = (np.arange(len(first)) - group_start).astype(np.int32)
    targets = segment_targets(spill, spill.offsets[seg_example] + seg_start, seg_length)
    keep = targets > 0
    kept_examples = np.unique(seg_example[keep])
    dropped_examples = np.setdiff1d(np.unique(seg_example), kept_examples)
    seg_rows = np.repeat(np.arange(len(row_offsets) - 1), np.diff(row_offsets))
    counts = np.bincount(seg_rows[keep], minlength=len(row_offsets) - 1)
    counts = counts[counts > 0]
    new_offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    plan = RowPlan(
        row_offsets=new_offsets,
        seg_example=seg_example[keep],
        seg_start=seg_start[keep],
        seg_length=seg_length[keep],
        seg_part=seg_part[keep],
        seg_targets=targets[keep],
        example_id=np.zeros(int(keep.sum()), dtype=np.int64),
        examples_dropped=dropped_examples,
        parts_dropped=int((~keep).sum()),
    )
    return number_examples(plan)


def ordering_stats(plan: RowPlan) -> dict[str, float]:
    """Length-order bias of a plan before shuffling: segments per row, first/last decile."""
    rows = plan.num_rows
    if rows == 0:
        return {
            "segments_per_row_mean": 0.0,
            "first_decile_mean_example_len": 0.0,
            "last_decile_mean_example_len": 0.0,
        }
    decile = max(1, -(-rows // 10))

    def mean_len(lo_row: int, hi_row: int) -> float:
        lo, hi = int(plan.row_offsets[lo_row]), int(plan.row_offsets[hi_row])
        return round(float(plan.seg_length[lo:hi].mean()), 3) if hi > lo else 0.0

    return {
        "segments_per_row_mean": round(plan.num_segments / rows, 4),
        "first_decile_mean_example_len": mean_len(0, decile),
        "last_decile_mean_example_len": mean_len(rows - decile, rows),
    }
