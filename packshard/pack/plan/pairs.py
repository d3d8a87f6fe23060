r"""Preference pairs planned as units: a pair is never split across rows.

Ingest gives a pair as two consecutive examples, chosen then rejected, kept within
``max_seq_len`` as a unit (:func:`packshard.pack.overlong.police_pairs`).  The planner sees
one length per unit (a pair's is its branches' sum); each pair unit is expanded into its two
segments, chosen first, adjacent::

    examples  [c0 r0] x1 [c2 r2]     units  u0 = c0 + r0, u1 = x1, u2 = c2 + r2
    planned   row 0: u2 u1 | row 1: u0      →  row 0: c2 r2 x1 | row 1: c0 r0

``wrapped`` cuts rows anywhere, so it refuses preference records.
"""

from __future__ import annotations

import numpy as np

from packshard.arrays import exclusive_cumsum
from packshard.errors import UsageError
from packshard.ingest import pair_starts
from packshard.pack.plan.planner import plan_packs
from packshard.pack.plan.rows import RowPlan


def plan_pair_units(
    lengths: np.ndarray, codes: np.ndarray | None, max_seq_len: int, strategy: str
) -> RowPlan:
    """Plan ``lengths`` with each pair (codes 1 then 2) one unit; segments name positions."""
    starts = pair_starts(codes) if codes is not None else np.zeros(0, np.int64)
    if not starts.size:
        return plan_packs(lengths, max_seq_len, strategy)
    if strategy == "wrapped":
        raise UsageError(
            "--strategy wrapped cuts rows anywhere and would split preference pairs "
            "(use --strategy bfd, ffd or sequential)"
        )
    lengths = np.asarray(lengths, dtype=np.int64)
    second = np.zeros(len(lengths), dtype=bool)
    second[starts + 1] = True
    unit_pos = np.flatnonzero(~second)  # each unit's first position
    is_pair = np.zeros(len(lengths), dtype=bool)
    is_pair[starts] = True
    partner = lengths[np.minimum(unit_pos + 1, len(lengths) - 1)]
    unit_len = lengths[unit_pos] + np.where(is_pair[unit_pos], partner, 0)
    raw = plan_packs(unit_len, max_seq_len, strategy)
    first = unit_pos[np.asarray(raw.seg_example, dtype=np.int64)]
    width = 1 + is_pair[first].astype(np.int64)
    seg_example = np.repeat(first, width)
    seg_example += np.arange(len(seg_example)) - np.repeat(exclusive_cumsum(width)[:-1], width)
    per_row = np.add.reduceat(width, raw.row_offsets[:-1]) if raw.num_rows else width[:0]
    return RowPlan.from_segments(
        exclusive_cumsum(per_row),
        seg_example,
        np.zeros(len(seg_example), np.int64),
        lengths[seg_example].astype(np.int32),
        max_seq_len,
        strategy,
    )
