"""Assemble packed rows from the spill: the shard columns of a block of planned rows.

A plan names, for every segment, the spilled example it comes from and the token range within
it.  Assembly gathers each segment's range from the spill (a jitted copy per segment) and
builds the columns with vectorised numpy, no per-token Python::

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
size: about 45 bytes a token each.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from packshard.arrays import arrow_array, count_trained, exclusive_cumsum
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
    read: ReadRanges, starts: np.ndarray, block: RowPlan, codes: np.ndarray | None = None
) -> pa.Table:
    """Build the shard table of ``block`` whose segment ``j`` is flat range ``starts[j]``.

    ``read(starts, lengths)`` returns the tokens and labels of those ranges, concatenated
    (:meth:`Spill.read_ranges`, or a write task's reader of the spill parts).  ``codes``, each
    segment's pair code (0 plain, 1 chosen, 2 rejected, 3/4 KTO undesirable/desirable), adds
    the ``branch`` and ``kto_label`` columns (:data:`~packshard.format.shards.PAIR_FIELDS`).
    """
    row_offsets = block.row_offsets
    seg_len = block.seg_length.astype(np.int64)
    nrows = len(row_offsets) - 1
    out_start = exclusive_cumsum(seg_len)
    total = int(out_start[-1])
    input_ids, labels = read(starts, seg_len)
    labels[out_start[:-1][seg_len > 0]] = IGNORE_INDEX
    kind = np.int32 if total < 2**31 else np.int64  # positions fit int32; the flat index may not
    flat: np.ndarray = np.arange(total, dtype=kind)
    np.subtract(flat, np.repeat(out_start[:-1].astype(kind), seg_len), out=flat)
    position_ids = flat.astype(np.int32, copy=False)
    row_tok = exclusive_cumsum(np.add.reduceat(seg_len, row_offsets[:-1]) if nrows else seg_len)
    seg_end_in_row = out_start[1:] - np.repeat(row_tok[:-1], np.diff(row_offsets))
    cu_offsets = row_offsets + np.arange(nrows + 1)
    cu_values = np.zeros(len(seg_len) + nrows, dtype=np.int32)
    is_end = np.ones(len(cu_values), dtype=bool)
    is_end[cu_offsets[:-1]] = False
    cu_values[is_end] = seg_end_in_row
    num_loss = count_trained(labels, row_tok, skip_first=False)
    max_seqlen = np.maximum.reduceat(seg_len, row_offsets[:-1]) if nrows else seg_len
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
