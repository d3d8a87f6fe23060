"""Context-parallel alignment: every segment padded to a multiple, ``cu_seqlens_padded``.

Context parallelism cuts each sequence into ``2·CP`` chunks (rank ``i`` takes ``i`` and
``2·CP−1−i``), and sequence parallelism over ``CP·TP`` ranks, so lengths must be multiples;
Megatron-Bridge's rule (its ``pad_seq_to_mult``) is::

    multiple = lcm(2·CP if CP > 1 else 1,  CP·TP if sequence parallel and TP > 1 else 1,  N)

with ``N`` any further multiple asked for (``--pad-multiple``).  ``pack --cp 4`` gives 8,
``--cp 2 --tp 4`` gives lcm(4, 8) = 8, ``--cp 4 --tp 2`` lcm(8, 8) = 8, ``--cp 3 --tp 2``
lcm(6, 6) = 6.

A pack stores no padding: an aligned pack adds ``cu_seqlens_padded`` beside ``cu_seqlens``,
each length rounded up to the multiple; the planner plans padded lengths, so a padded row
never exceeds ``max_seq_len`` (itself a multiple).  For ``multiple = 4``::

    input_ids            a a a a a | b b                     cu_seqlens        [0, 5, 7]
    cu_seqlens_padded    [0, 8, 12]                          each length ⌈n/4⌉·4: 5 → 8, 2 → 4

    padded row (:func:`padded_row`, what the reader serves and ``verify`` runs)
    input_ids            a a a a a p p p | b b p p           p = the pad id
    labels               - a a a a - - - | - b - -           pads never trained
    position_ids         0 1 2 3 4 5 6 7 | 0 1 2 3           positions run on through the pads
    cu_seqlens           [0, 8, 12]                          the physical boundaries
    cu_seqlens_unpadded  [0, 5, 7]                           the real lengths (TE's cu_seqlens)

Pads come after a segment's last real token, so no real token attends one.
"""

from __future__ import annotations

import math

import numpy as np

from packshard.arrays import exclusive_cumsum
from packshard.errors import UsageError
from packshard.records import IGNORE_INDEX, PackedRow

PADDED_COLUMN = "cu_seqlens_padded"
MAX_MULTIPLE = 1 << 16


def alignment_multiple(pad_multiple: int = 1, cp: int = 1, tp: int = 1) -> int:
    """Return the segment multiple of ``--pad-multiple``, ``--cp`` and ``--tp`` (1: none).

    ``tp`` counts only with context parallelism and sequence parallelism on (pass it then).
    """
    for flag, value in (("--pad-multiple", pad_multiple), ("--cp", cp), ("--tp", tp)):
        if type(value) is not int or not 1 <= value <= MAX_MULTIPLE:
            raise UsageError(f"{flag} must be an integer in [1, {MAX_MULTIPLE}], got {value!r}")
    if tp > 1 and cp == 1:
        raise UsageError(
            "--tp sets the alignment only with context parallelism (add --cp N, or use "
            "--pad-multiple for a plain multiple)"
        )
    return math.lcm(pad_multiple, 2 * cp if cp > 1 else 1, cp * tp if tp > 1 else 1)


def padded_lengths(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """Return each length rounded up to ``multiple`` (int64)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return -(-lengths // multiple) * multiple


def padded_cu_seqlens(cu_values: np.ndarray, cu_offsets: np.ndarray, multiple: int) -> np.ndarray:
    """Return the flat ``cu_seqlens_padded`` values of a ``cu_seqlens`` list column.

    ``cu_values``/``cu_offsets`` are the column's flat values and row offsets; the result has
    the same offsets: every row starts at 0 and each step is the padded segment length.
    """
    cu = np.asarray(cu_values, dtype=np.int64)
    offsets = np.asarray(cu_offsets, dtype=np.int64)
    steps = padded_lengths(np.diff(cu), multiple) if len(cu) else cu
    steps[offsets[1:-1] - 1] = 0  # a row's first entry: no step from the previous row's last
    out = np.cumsum(np.r_[0, steps]) if len(cu) else cu
    starts = np.repeat(out[offsets[:-1]], np.diff(offsets))
    return (out - starts).astype(np.int32)


def pad_segments(
    values: np.ndarray, lengths: np.ndarray, widths: np.ndarray, fill: int
) -> np.ndarray:
    """Return ``values`` (segments of ``lengths`` end to end) with each segment widened.

    Segment ``j`` fills the start of a slot of ``widths[j]`` ≥ ``lengths[j]`` entries, the
    rest of the slot ``fill``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    widths = np.asarray(widths, dtype=np.int64)
    out = np.full(int(widths.sum()), fill, dtype=values.dtype)
    where = np.repeat(exclusive_cumsum(widths)[:-1] - exclusive_cumsum(lengths)[:-1], lengths)
    out[where + np.arange(int(lengths.sum()), dtype=np.int64)] = values
    return out


def padded_row(row: PackedRow, padded: np.ndarray, pad_id: int) -> tuple[PackedRow, np.ndarray]:
    """Return ``row`` with its pads inserted, and its real boundaries (``cu_seqlens_unpadded``).

    ``padded`` is the row's ``cu_seqlens_padded``; the returned row's ``cu_seqlens`` is it.
    """
    real: np.ndarray = np.diff(row.cu_seqlens.astype(np.int64))
    width: np.ndarray = np.diff(np.asarray(padded, dtype=np.int64))
    starts = np.repeat(padded[:-1].astype(np.int64), width)
    positions = np.arange(int(width.sum()), dtype=np.int64) - starts
    out = PackedRow(
        input_ids=pad_segments(row.input_ids, real, width, pad_id),
        labels=pad_segments(row.labels, real, width, IGNORE_INDEX),
        position_ids=positions.astype(row.position_ids.dtype),
        cu_seqlens=padded.astype(np.int32),
        example_ids=row.example_ids,
    )
    return out, exclusive_cumsum(real).astype(np.int32)


def padded_rows_wrong(
    cu_values: np.ndarray,
    cu_offsets: np.ndarray,
    padded_values: np.ndarray,
    padded_offsets: np.ndarray,
    multiple: int,
    max_seq_len: int,
) -> np.ndarray:
    """Return the rows whose ``cu_seqlens_padded`` is not exact.

    Exact means: one entry per ``cu_seqlens`` entry, equal to :func:`padded_cu_seqlens` of
    it (every segment the least multiple of ``multiple`` that holds it, pads after its
    tokens), and no padded row longer than ``max_seq_len``.
    """
    cu_offsets = np.asarray(cu_offsets, dtype=np.int64)
    padded_offsets = np.asarray(padded_offsets, dtype=np.int64)
    if not np.array_equal(cu_offsets, padded_offsets):
        return np.flatnonzero(np.diff(cu_offsets) != np.diff(padded_offsets))
    want = padded_cu_seqlens(cu_values, cu_offsets, multiple).astype(np.int64)
    got = np.asarray(padded_values, dtype=np.int64)
    rows = np.searchsorted(cu_offsets, np.flatnonzero(want != got), side="right") - 1
    over = np.flatnonzero(got[cu_offsets[1:] - 1] > max_seq_len) if len(got) else rows[:0]
    return np.unique(np.concatenate([rows, over]))
