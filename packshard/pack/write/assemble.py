"""Assemble packed rows from the spill: the shard columns of a block of planned rows.

A plan names, for every segment, the spilled example it comes from and the token range within
it.  Assembly gathers each segment's range from the spill (a jitted copy per segment), writes
the token columns and each row's trained labels in one jitted pass (:func:`fill_tokens`), and
the per-segment ones with vectorised numpy, no per-token Python::

    segments   [ex7 0:5] [ex2 0:2] [ex9 0:1] | [ex4 0:6] [ex1 0:2]
    row          0                            | 1
    input_ids    a a a a a b b c              | d d d d d d e e
    labels       - a a a a - b -              | - d d d d d - e      ('-' = IGNORE_INDEX)
    position_ids 0 1 2 3 4 0 1 0              | 0 1 2 3 4 5 0 1
    cu_seqlens   [0, 5, 7, 8]                 | [0, 6, 8]

Invariants of every assembled row: the first label of every segment is masked (no target
crosses a seam), positions restart at 0 in every segment (policy ``reset``), ``cu_seqlens``
records every boundary, and the per-row totals are computed from the columns themselves.  The
pipeline assembles one row group (``ROW_GROUP_ROWS`` rows) at a time, so memory holds the
columns of two row groups (one being written while the next is assembled) whatever the shard
size: about 45 bytes a token each.  The one pass replaced six over every token (the seam
labels masked, two copies, positions from a range less each segment's start, the trained
labels' flags and their positions): a 1M-example repack's assembly (23.0M tokens) went from
0.23-0.35 to 0.16-0.31 CPU-s, the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise

import numpy as np
import pyarrow as pa
from numba import njit

from packshard.arrays import arrow_array, exclusive_cumsum
from packshard.format.shards import PAIR_FIELDS, SHARD_SCHEMA
from packshard.pack.plan.rows import RowPlan
from packshard.pack.spill import Spill
from packshard.records import IGNORE_INDEX

ReadRanges = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def assemble_rows(spill: Spill, block: RowPlan) -> pa.Table:
    """Build the shard table of a block of rows (a :meth:`RowPlan.rows` slice) from the spill."""
    codes = spill.pair_codes
    return assemble_ranges(
        spill.read_ranges,
        spill.offsets[block.seg_example] + block.seg_start,
        block,
        codes[block.seg_example] if codes is not None and codes.any() else None,
    )


def assemble_ranges(
    read: ReadRanges,
    starts: np.ndarray,
    block: RowPlan,
    codes: np.ndarray | None = None,
    cuts: Sequence[int] | None = None,
) -> pa.Table:
    """Build the shard table of ``block`` whose segment ``j`` is flat range ``starts[j]``.

    ``read(starts, lengths)`` returns the tokens and labels of those ranges, concatenated
    (:meth:`Spill.read_ranges`, or a write task's reader of the spill parts).  ``codes``, each
    segment's pair code (0 plain, 1 chosen, 2 rejected, 3/4 KTO undesirable/desirable), adds
    the ``branch`` and ``kto_label`` columns (:data:`~packshard.format.shards.PAIR_FIELDS`).

    ``cuts`` (rows ``0 = c0 < c1 < … = rows``) assembles the rows a piece at a time into the
    one table's columns: the per-segment temporaries (about 100 bytes a segment) are a
    piece's, the columns are made once, whole; the same table as without cuts.
    """
    row_offsets = np.asarray(block.row_offsets, dtype=np.int64)
    nrows = len(row_offsets) - 1
    lengths = block.seg_length
    per_row = np.add.reduceat(lengths, row_offsets[:-1], dtype=np.int64) if nrows else lengths
    row_tok = exclusive_cumsum(np.asarray(per_row, dtype=np.int64))
    total = int(row_tok[-1])
    input_ids = np.empty(total, np.int32)
    labels = np.empty(total, np.int32)
    position_ids = np.empty(total, np.int32)
    cu_offsets = row_offsets + np.arange(nrows + 1)
    cu_values = np.zeros(int(cu_offsets[-1]), dtype=np.int32)
    num_loss = np.zeros(nrows, np.int64)
    max_seqlen = np.zeros(nrows, np.int64)
    for a, b in pairwise(cuts if cuts is not None else (0, nrows)):
        lo, hi, t0, t1 = (int(v) for v in (row_offsets[a], row_offsets[b], row_tok[a], row_tok[b]))
        seg_len = lengths[lo:hi].astype(np.int64)
        out_start = exclusive_cumsum(seg_len)
        ids, labs = read(starts[lo:hi], seg_len)
        rows_at, tok_at = row_offsets[a : b + 1] - lo, row_tok[a : b + 1] - t0
        fill_tokens(
            ids,
            labs,
            seg_len,
            rows_at,
            input_ids[t0:t1],
            labels[t0:t1],
            position_ids[t0:t1],
            num_loss[a:b],
        )
        del ids, labs
        seg_end_in_row = out_start[1:] - np.repeat(tok_at[:-1], np.diff(rows_at))
        local_cu = rows_at + np.arange(b - a + 1)
        is_end = np.ones(int(local_cu[-1]), dtype=bool)
        is_end[local_cu[:-1]] = False
        cu_values[int(cu_offsets[a]) : int(cu_offsets[b])][is_end] = seg_end_in_row
        if b > a:
            max_seqlen[a:b] = np.maximum.reduceat(seg_len, rows_at[:-1])
    tok_off = arrow_array(row_tok.astype(np.int32))
    seg_off = arrow_array(row_offsets.astype(np.int32))
    columns = [
        pa.ListArray.from_arrays(tok_off, arrow_array(input_ids)),
        pa.ListArray.from_arrays(tok_off, arrow_array(labels)),
        pa.ListArray.from_arrays(tok_off, arrow_array(position_ids)),
        pa.ListArray.from_arrays(arrow_array(cu_offsets.astype(np.int32)), arrow_array(cu_values)),
        pa.ListArray.from_arrays(seg_off, arrow_array(block.example_id.astype(np.int64))),
        arrow_array(np.diff(row_tok).astype(np.int32)),
        arrow_array(num_loss.astype(np.int32)),
        arrow_array(max_seqlen.astype(np.int32)),
    ]
    table = pa.Table.from_arrays(columns, schema=SHARD_SCHEMA)
    if codes is None:
        return table
    code = np.asarray(codes, dtype=np.int8)
    branch = np.where(code <= 2, code, 0).astype(np.int8)
    kto = np.where(code >= 3, code - 3, -1).astype(np.int8)
    for field, values in zip(PAIR_FIELDS, (branch, kto), strict=True):
        table = table.append_column(field, pa.ListArray.from_arrays(seg_off, arrow_array(values)))
    return table


@njit(cache=True, nogil=True)
def fill_tokens(  # pragma: no cover - jitted
    ids: np.ndarray,
    labels: np.ndarray,
    seg_len: np.ndarray,
    row_offsets: np.ndarray,
    out_ids: np.ndarray,
    out_labels: np.ndarray,
    positions: np.ndarray,
    num_loss: np.ndarray,
) -> None:
    """Write the token columns of rows whose segments' tokens ``ids``, ``labels`` hold, in order.

    Row ``r`` holds segments ``row_offsets[r]:row_offsets[r + 1]`` (of ``seg_len``); each
    segment's first label becomes ``IGNORE_INDEX``, its positions count from 0, and
    ``num_loss[r]`` is the row's labels other than ``IGNORE_INDEX`` once masked.  One pass
    where numpy took one a column and more for the positions and counts.
    """
    t = 0
    for r in range(len(row_offsets) - 1):
        loss = 0
        for s in range(row_offsets[r], row_offsets[r + 1]):
            for j in range(seg_len[s]):
                label = labels[t] if j else IGNORE_INDEX
                out_ids[t] = ids[t]
                out_labels[t] = label
                positions[t] = j
                if label != IGNORE_INDEX:
                    loss += 1
                t += 1
        num_loss[r] = loss
