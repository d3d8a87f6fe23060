"""The planners: hand-computed packs, edge cases, and kernel == reference properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packshard.arrays import fill_rate, lower_bound_rows
from packshard.errors import UsageError
from packshard.options import STRATEGIES
from packshard.pack.plan.planner import plan_packs, plan_packs_reference
from packshard.pack.plan.rows import RowPlan

FIELDS = ("row_offsets", "seg_example", "seg_start", "seg_length")


def rows_of(plan: RowPlan) -> list[list[tuple[int, int, int]]]:
    """The plan as [[(example, start, length), ...] per row] for readable assertions."""
    return [
        [
            (int(plan.seg_example[s]), int(plan.seg_start[s]), int(plan.seg_length[s]))
            for s in range(plan.row_offsets[r], plan.row_offsets[r + 1])
        ]
        for r in range(plan.num_rows)
    ]


def assert_same(a: RowPlan, b: RowPlan) -> None:
    for name in FIELDS:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.max_seq_len == b.max_seq_len
    assert a.strategy == b.strategy


def check_invariants(plan: RowPlan, lengths: np.ndarray, max_seq_len: int) -> None:
    """Everything a plan must satisfy whatever the strategy."""
    assert plan.row_offsets.dtype == np.int64
    wide = plan.strategy in ("wrapped", "sequential")  # bfd/ffd: int32 while examples fit
    assert plan.seg_example.dtype == (np.int64 if wide else np.int32)
    assert plan.seg_start.dtype == np.int64
    assert plan.seg_length.dtype == np.int32
    assert plan.row_offsets[0] == 0
    assert plan.row_offsets[-1] == plan.num_segments
    assert np.all(np.diff(plan.row_offsets) >= 1)  # no empty row
    assert np.all(plan.row_tokens() <= max_seq_len)
    assert np.all(plan.seg_length >= 1)
    total = int(np.sum(lengths, dtype=np.int64))
    assert plan.num_rows >= lower_bound_rows(total, max_seq_len) == plan.lower_bound_rows
    assert plan.num_tokens == total
    assert plan.fill_rate == fill_rate(total, plan.num_rows, max_seq_len)
    assert plan.max_seq_len == max_seq_len
    # straight from the planner: parts, targets and example ids are not known yet
    for name in ("seg_part", "seg_targets", "example_id"):
        assert not getattr(plan, name).any() and len(getattr(plan, name)) == plan.num_segments
    if plan.strategy == "wrapped" and len(lengths):
        # Token coverage is exact and in input order: the segments tile the stream.
        assert np.array_equal(plan.seg_example, np.sort(plan.seg_example, kind="stable"))
        ends = plan.seg_start + plan.seg_length
        first = np.r_[True, plan.seg_example[1:] != plan.seg_example[:-1]]
        assert np.all(plan.seg_start[first] == 0)
        assert np.array_equal(plan.seg_start[~first], ends[:-1][~first[1:]])
        last = np.r_[first[1:], True]
        assert np.array_equal(ends[last], lengths[plan.seg_example[last]])
        assert np.array_equal(np.unique(plan.seg_example), np.flatnonzero(lengths))
        assert np.all(plan.row_tokens()[:-1] == max_seq_len)  # only the last row is partial
    elif plan.strategy != "wrapped":
        assert np.array_equal(np.sort(plan.seg_example), np.arange(len(lengths)))
        assert np.all(plan.seg_start == 0)
        assert np.array_equal(plan.seg_length, lengths[plan.seg_example])
    if plan.strategy in ("bfd", "ffd"):
        # Within a row, placement order: longest first, then by example index.
        row = plan.segment_rows()
        key = np.lexsort((plan.seg_example, -plan.seg_length.astype(np.int64), row))
        assert np.array_equal(key, np.arange(plan.num_segments))


# -- hand-computed packs ---------------------------------------------------------------------


def test_bfd_small_pack_by_hand():
    # L=8, sorted 7,5,3,2,1: 7 opens row 0 (room 1), 5 opens row 1 (room 3), 3 fills row 1,
    # 2 fits nowhere and opens row 2 (room 6), 1 goes to row 0 (room 1, the least that fits).
    plan = plan_packs(np.array([5, 2, 1, 7, 3]), 8, "bfd")
    assert rows_of(plan) == [[(3, 0, 7), (2, 0, 1)], [(0, 0, 5), (4, 0, 3)], [(1, 0, 2)]]
    assert plan.row_tokens().tolist() == [8, 8, 2]
    assert plan.lower_bound_rows == 3
    assert plan.fill_rate == pytest.approx(18 / 24)


def test_ffd_small_pack_by_hand():
    plan = plan_packs(np.array([5, 2, 1, 7, 3]), 8, "ffd")
    assert rows_of(plan) == [[(3, 0, 7), (2, 0, 1)], [(0, 0, 5), (4, 0, 3)], [(1, 0, 2)]]


def test_bfd_and_ffd_differ_on_the_last_item():
    # L=7, sorted 5,3,3,1: rows are [5] (room 2) and [3,3] (room 1).  Best fit puts the 1 in
    # the tighter second row; first fit puts it in the first row.
    lengths = np.array([3, 1, 5, 3])
    assert rows_of(plan_packs(lengths, 7, "bfd")) == [
        [(2, 0, 5)],
        [(0, 0, 3), (3, 0, 3), (1, 0, 1)],
    ]
    assert rows_of(plan_packs(lengths, 7, "ffd")) == [
        [(2, 0, 5), (1, 0, 1)],
        [(0, 0, 3), (3, 0, 3)],
    ]


def test_bfd_breaks_room_ties_towards_the_row_changed_last():
    # L=4, sorted 3,3,1: rows 0 and 1 both have room 1; row 1 changed last, so bfd takes it.
    lengths = np.array([1, 3, 3])
    assert rows_of(plan_packs(lengths, 4, "bfd")) == [[(1, 0, 3)], [(2, 0, 3), (0, 0, 1)]]
    assert rows_of(plan_packs(lengths, 4, "ffd")) == [[(1, 0, 3), (0, 0, 1)], [(2, 0, 3)]]


def test_bfd_fills_one_row_with_copies_before_the_next():
    # Six 3s into rows of 10: 3 copies per row, the last row partial.
    plan = plan_packs(np.full(7, 3), 10, "bfd")
    assert [[s[0] for s in row] for row in rows_of(plan)] == [[0, 1, 2], [3, 4, 5], [6]]


def test_wrapped_splits_examples_at_row_ends():
    # Stream 5,2,1,7,3 = 18 tokens in rows of 8: [5,2,1] [7,1 of the 3] [2 of the 3].
    plan = plan_packs(np.array([5, 2, 1, 7, 3]), 8, "wrapped")
    assert rows_of(plan) == [[(0, 0, 5), (1, 0, 2), (2, 0, 1)], [(3, 0, 7), (4, 0, 1)], [(4, 1, 2)]]


def test_wrapped_long_example_spans_rows():
    plan = plan_packs(np.array([2, 11, 1]), 4, "wrapped")
    assert rows_of(plan) == [
        [(0, 0, 2), (1, 0, 2)],
        [(1, 2, 4)],
        [(1, 6, 4)],
        [(1, 10, 1), (2, 0, 1)],
    ]


# -- edge cases ------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_empty_lengths_give_an_empty_plan(strategy, dtype):
    plan = plan_packs(np.array([], dtype), 16, strategy)
    assert plan.num_rows == 0
    assert plan.row_offsets.tolist() == [0]
    assert plan.num_segments == 0
    assert plan.row_tokens().tolist() == []
    assert plan.fill_rate == 0.0  # no rows, nothing filled (the one definition, arrays.fill_rate)
    assert plan.lower_bound_rows == 0 and plan.strategy == strategy
    assert_same(plan, plan_packs_reference([], 16, strategy))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_one_example_is_one_row(strategy):
    plan = plan_packs(np.array([5], np.int32), 16, strategy)
    assert rows_of(plan) == [[(0, 0, 5)]]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_full_length_examples_take_a_row_each_in_order(strategy):
    plan = plan_packs(np.full(5, 16), 16, strategy)
    assert rows_of(plan) == [[(i, 0, 16)] for i in range(5)]
    assert plan.fill_rate == 1.0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_many_length_one_examples_fill_rows_in_index_order(strategy):
    plan = plan_packs(np.ones(1000, np.int64), 64, strategy)
    assert plan.num_rows == 16
    assert plan.row_tokens().tolist() == [64] * 15 + [40]
    assert np.array_equal(plan.seg_example, np.arange(1000))


def test_int32_and_int64_lengths_give_the_same_plan():
    lengths = np.random.default_rng(3).integers(1, 100, 5000)
    for strategy in STRATEGIES:
        assert_same(
            plan_packs(lengths.astype(np.int32), 100, strategy),
            plan_packs(lengths.astype(np.int64), 100, strategy),
        )


def test_large_max_seq_len_uses_the_second_bitmap_level():
    lengths = np.random.default_rng(4).integers(1, 70_000, 300)
    for strategy in ("bfd", "ffd"):
        plan = plan_packs(lengths, 70_000, strategy)
        check_invariants(plan, lengths, 70_000)
        assert_same(plan, plan_packs_reference(lengths, 70_000, strategy))


@pytest.mark.parametrize("strategy", ["bfd", "ffd"])
def test_overlong_example_is_refused_with_its_index(strategy):
    with pytest.raises(UsageError) as err:
        plan_packs(np.array([3, 9, 2]), 8, strategy)
    assert str(err.value) == (
        f"example 1 has length 9, outside 1..8 for strategy {strategy!r} "
        "(use --overlong truncate|split|drop)"
    )


def test_zero_length_is_refused_even_when_wrapped():
    with pytest.raises(UsageError, match=r"^example 2 has length 0, outside ≥ 1"):
        plan_packs(np.array([3, 9, 0]), 8, "wrapped")


def test_bad_arguments_are_usage_errors():
    with pytest.raises(UsageError, match=r"unknown packing strategy 'best' \(use --strategy"):
        plan_packs(np.array([1]), 8, "best")
    with pytest.raises(UsageError, match=r"max_seq_len is 0, it must be ≥ 1"):
        plan_packs(np.array([1]), 0)
    with pytest.raises(UsageError, match="1-D integer array"):
        plan_packs(np.array([1.5]), 8)


def test_plan_capacity_figures_are_the_shared_definitions():
    plan = plan_packs(np.array([5, 2, 1, 7, 3]), 8, "bfd")
    assert (plan.strategy, plan.max_seq_len, plan.num_tokens) == ("bfd", 8, 18)
    assert plan.lower_bound_rows == lower_bound_rows(18, 8) == 3
    assert plan.fill_rate == fill_rate(18, 3, 8) == 0.75
    full = plan_packs(np.array([8, 8]), 8, "ffd")
    assert (full.lower_bound_rows, full.fill_rate) == (2, 1.0)


# -- properties ------------------------------------------------------------------------------


@st.composite
def problems(draw, wrapped=False):
    max_seq_len = draw(st.integers(1, 300))
    top = 3 * max_seq_len if wrapped else max_seq_len
    # Few distinct lengths make many ties; the tests want both kinds of input.
    pool = draw(st.lists(st.integers(1, top), min_size=1, max_size=8))
    values = draw(st.lists(st.one_of(st.sampled_from(pool), st.integers(1, top)), max_size=80))
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    return np.array(values, dtype), max_seq_len


@pytest.mark.parametrize("strategy", ["bfd", "ffd"])
@settings(max_examples=150, deadline=None)
@given(problem=problems())
def test_binpacking_matches_reference_and_keeps_invariants(strategy, problem):
    lengths, max_seq_len = problem
    plan = plan_packs(lengths, max_seq_len, strategy)
    check_invariants(plan, lengths, max_seq_len)
    assert_same(plan, plan_packs_reference(lengths, max_seq_len, strategy))
    assert_same(plan, plan_packs(lengths.copy(), max_seq_len, strategy))
    # Any-fit bound: at most one row is half empty or worse.
    assert np.count_nonzero(2 * plan.row_tokens() <= max_seq_len) <= 1


@settings(max_examples=150, deadline=None)
@given(problem=problems(wrapped=True))
def test_wrapped_matches_reference_and_covers_every_token(problem):
    lengths, max_seq_len = problem
    plan = plan_packs(lengths, max_seq_len, "wrapped")
    check_invariants(plan, lengths, max_seq_len)
    assert plan.num_rows == lower_bound_rows(int(lengths.sum()), max_seq_len)
    assert_same(plan, plan_packs_reference(lengths, max_seq_len, "wrapped"))
    assert_same(plan, plan_packs(lengths.copy(), max_seq_len, "wrapped"))


@settings(max_examples=100, deadline=None)
@given(problem=problems())
def test_bfd_and_ffd_row_counts_are_within_the_11_9_bound(problem):
    # Both use at most 11/9·OPT + 6/9 rows, and OPT ≤ either count.
    lengths, max_seq_len = problem
    bfd = plan_packs(lengths, max_seq_len, "bfd").num_rows
    ffd = plan_packs(lengths, max_seq_len, "ffd").num_rows
    assert 9 * bfd <= 11 * ffd + 6 and 9 * ffd <= 11 * bfd + 6


def test_bfd_is_near_the_lower_bound_on_realistic_lengths():
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.lognormal(np.log(300), 1.0, 200_000)), 1, 4096).astype(np.int64)
    plan = plan_packs(lengths, 4096)
    check_invariants(plan, lengths, 4096)
    assert plan.num_rows <= lower_bound_rows(int(lengths.sum()), 4096) * 1.001


@pytest.mark.parametrize("strategy", ["bfd", "ffd"])
def test_threaded_passes_give_the_same_plan_as_one_thread(monkeypatch, strategy):
    """Large inputs run the passes on threads; the plan must not depend on it."""
    from packshard.pack.plan import planner as packing

    rng = np.random.default_rng(11)
    lengths = np.clip(np.round(rng.lognormal(np.log(40), 1.0, 20_000)), 1, 256).astype(np.int64)
    monkeypatch.setattr(packing, "_THREADED", 1 << 62)
    single = plan_packs(lengths, 256, strategy)
    monkeypatch.setattr(packing, "_THREADED", 1)
    monkeypatch.setattr(packing, "_WORKERS", 2)
    threaded = plan_packs(lengths, 256, strategy)
    reference = plan_packs_reference(lengths, 256, strategy)
    for name in ("row_offsets", "seg_example", "seg_start", "seg_length"):
        assert np.array_equal(getattr(single, name), getattr(threaded, name)), name
        assert np.array_equal(getattr(threaded, name), getattr(reference, name)), name


# -- sequential: next-fit in input order -------------------------------------------------------


def test_sequential_small_pack_by_hand():
    plan = plan_packs(np.array([3, 4, 2, 5, 1, 6]), 8, "sequential")
    assert rows_of(plan) == [[(0, 0, 3), (1, 0, 4)], [(2, 0, 2), (3, 0, 5), (4, 0, 1)], [(5, 0, 6)]]


@settings(max_examples=150, deadline=None)
@given(problem=problems())
def test_sequential_keeps_input_order_and_matches_reference(problem):
    lengths, max_seq_len = problem
    plan = plan_packs(lengths, max_seq_len, "sequential")
    check_invariants(plan, lengths, max_seq_len)
    assert np.array_equal(plan.seg_example, np.arange(len(lengths)))  # read in order: input order
    assert_same(plan, plan_packs_reference(lengths, max_seq_len, "sequential"))
    # Next-fit is optimal among cuts that keep the order: no row could take the next example.
    tokens = plan.row_tokens()
    firsts = plan.seg_example[plan.row_offsets[1:-1]]
    assert np.all(tokens[:-1] + lengths[firsts] > max_seq_len)


def test_sequential_row_count_is_the_fewest_that_keep_the_order():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=60)
    plan = plan_packs(lengths, 50, "sequential")
    # dynamic programme over every order-keeping cut: fewest rows for the first i examples
    best = [0] + [10**9] * len(lengths)
    for i in range(1, len(lengths) + 1):
        for j in range(i - 1, -1, -1):
            if lengths[j:i].sum() > 50:
                break
            best[i] = min(best[i], best[j] + 1)
    assert plan.num_rows == best[-1]
