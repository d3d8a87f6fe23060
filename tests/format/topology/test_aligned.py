"""Context-parallel alignment: Megatron-Bridge's multiple, padded boundaries, padded rows."""

from __future__ import annotations

import numpy as np
import pytest

from packshard.errors import UsageError
from packshard.format.topology import (
    alignment_multiple,
    pad_segments,
    padded_cu_seqlens,
    padded_lengths,
    padded_row,
    padded_rows_wrong,
)
from packshard.records import IGNORE_INDEX, PackedRow


@pytest.mark.parametrize(
    ("pad_multiple", "cp", "tp", "want"),
    [
        (1, 1, 1, 1),
        (1, 2, 1, 4),  # 2·CP
        (1, 4, 1, 8),
        (1, 2, 4, 8),  # lcm(2·CP, CP·TP) = lcm(4, 8)
        (1, 4, 2, 8),  # lcm(8, 8)
        (1, 3, 2, 6),  # lcm(6, 6)
        (1, 2, 3, 12),  # lcm(4, 6)
        (16, 2, 1, 16),  # a further multiple, by lcm
        (3, 1, 1, 3),
    ],
)
def test_the_multiple_is_megatron_bridges_rule(pad_multiple, cp, tp, want):
    assert alignment_multiple(pad_multiple, cp, tp) == want


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cp": 0}, "--cp must be an integer"),
        ({"pad_multiple": -2}, "--pad-multiple must be"),
        ({"tp": 2}, "--tp sets the alignment only with context parallelism"),
    ],
)
def test_impossible_alignments_are_refused(kwargs, message):
    with pytest.raises(UsageError, match=message):
        alignment_multiple(**kwargs)


def test_padded_boundaries_round_every_segment_up_per_row():
    cu = np.array([0, 5, 7, 0, 6, 8, 0, 4], np.int32)  # three rows: 5+2, 6+2, 4
    offsets = np.array([0, 3, 6, 8])
    assert padded_cu_seqlens(cu, offsets, 4).tolist() == [0, 8, 12, 0, 8, 12, 0, 4]
    assert padded_cu_seqlens(cu, offsets, 1).tolist() == cu.tolist()
    assert padded_lengths(np.array([1, 4, 5, 8]), 4).tolist() == [4, 4, 8, 8]


def test_a_padded_row_puts_the_pads_after_each_segment_untrained():
    row = PackedRow(
        input_ids=np.array([1, 2, 3, 4, 5, 6, 7], np.int32),
        labels=np.array([IGNORE_INDEX, 2, 3, 4, 5, IGNORE_INDEX, 7], np.int32),
        position_ids=np.array([0, 1, 2, 3, 4, 0, 1], np.int32),
        cu_seqlens=np.array([0, 5, 7], np.int32),
        example_ids=np.array([3, 9]),
    )
    padded = padded_cu_seqlens(row.cu_seqlens, np.array([0, 3]), 4)
    out, real = padded_row(row, padded, pad_id=0)
    p = IGNORE_INDEX
    assert out.input_ids.tolist() == [1, 2, 3, 4, 5, 0, 0, 0, 6, 7, 0, 0]
    assert out.labels.tolist() == [p, 2, 3, 4, 5, p, p, p, p, 7, p, p]
    assert out.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]
    assert out.cu_seqlens.tolist() == [0, 8, 12]
    assert real.tolist() == [0, 5, 7]
    assert out.example_ids.tolist() == [3, 9]


def test_pad_segments_widens_each_slot():
    got = pad_segments(np.array([1, 1, 2]), np.array([2, 1]), np.array([3, 2]), fill=9)
    assert got.tolist() == [1, 1, 9, 2, 9]


def test_a_wrong_padded_column_is_caught_and_the_exact_one_is_not():
    cu = np.array([0, 5, 7, 0, 6, 8], np.int32)
    offsets = np.array([0, 3, 6])
    exact = padded_cu_seqlens(cu, offsets, 4)
    assert padded_rows_wrong(cu, offsets, exact, offsets, 4, 16).size == 0
    short = exact.copy()
    short[4] = 6  # row 1's first segment padded to 6, not 8
    assert padded_rows_wrong(cu, offsets, short, offsets, 4, 16).tolist() == [1]
    assert padded_rows_wrong(cu, offsets, exact, offsets, 4, 8).tolist() == [0, 1]  # over 8
    assert padded_rows_wrong(cu, offsets, exact[:5], np.array([0, 3, 5]), 4, 16).tolist() == [1]
