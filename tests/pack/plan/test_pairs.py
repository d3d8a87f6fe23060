"""A preference pair planned as one unit: both branches adjacent in one row, chosen first."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from packshard.errors import UsageError
from packshard.pack.plan.pairs import plan_pair_units
from packshard.pack.plan.planner import plan_packs


def rows_of(plan) -> list[list[int]]:
    seg = np.asarray(plan.seg_example).tolist()
    offsets = np.asarray(plan.row_offsets).tolist()
    return [seg[lo:hi] for lo, hi in itertools.pairwise(offsets)]


def test_without_pairs_the_plan_is_the_plain_planners():
    lengths = np.array([5, 3, 8, 2, 7], np.int32)
    for codes in (None, np.zeros(5, np.int8), np.array([0, 3, 4, 0, 0], np.int8)):
        got, want = plan_pair_units(lengths, codes, 10, "bfd"), plan_packs(lengths, 10, "bfd")
        assert rows_of(got) == rows_of(want)


@pytest.mark.parametrize("strategy", ["bfd", "ffd", "sequential"])
def test_a_pair_is_one_unit_expanded_chosen_then_rejected(strategy):
    # examples: pair (0, 1) 3 + 4, plain 2 of 5, pair (3, 4) 6 + 3, plain 5 of 1
    lengths = np.array([3, 4, 5, 6, 3, 1], np.int32)
    codes = np.array([1, 2, 0, 1, 2, 0], np.int8)
    plan = plan_pair_units(lengths, codes, 10, strategy)
    rows = rows_of(plan)
    assert sorted(x for row in rows for x in row) == list(range(6))
    for row in rows:
        for first in (0, 3):
            assert (first in row) == (first + 1 in row)
            if first in row:
                assert row.index(first + 1) == row.index(first) + 1
    assert np.asarray(plan.seg_length).tolist() == lengths[np.concatenate(rows)].tolist()
    assert max(int(lengths[row].sum()) for row in rows) <= 10


def test_pairs_reach_the_lower_bound_when_units_allow_it():
    rng = np.random.default_rng(0)
    n = 2000
    lengths = rng.integers(50, 700, size=2 * n).astype(np.int32)
    codes = np.tile(np.array([1, 2], np.int8), n)
    plan = plan_pair_units(lengths, codes, 4096, "bfd")
    bound = -(-int(lengths.sum()) // 4096)
    assert plan.num_rows <= bound * 1.01


def test_wrapped_refuses_pairs():
    with pytest.raises(UsageError, match="would split preference pairs"):
        plan_pair_units(np.array([3, 4], np.int32), np.array([1, 2], np.int8), 10, "wrapped")


def test_a_unit_longer_than_a_row_is_named():
    with pytest.raises(UsageError, match=r"outside 1\.\.10"):
        plan_pair_units(np.array([6, 6], np.int32), np.array([1, 2], np.int8), 10, "bfd")
