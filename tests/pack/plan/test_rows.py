"""Row plans: example numbering, wrapped parts, target-less parts, permutation, ordering."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import packshard.pack.plan.rows as plan_module
from packshard.pack.plan.planner import plan_packs
from packshard.pack.plan.rows import (
    RowPlan,
    finalize_plan,
    number_examples,
    ordering_stats,
    segment_targets,
)
from packshard.records import IGNORE_INDEX as X
from tests.helpers import make_spill


def segments(plan: RowPlan) -> list[list[tuple[int, int, int]]]:
    return [
        [
            (int(plan.seg_example[s]), int(plan.seg_start[s]), int(plan.seg_length[s]))
            for s in range(plan.row_offsets[r], plan.row_offsets[r + 1])
        ]
        for r in range(plan.num_rows)
    ]


def test_bfd_plan_numbers_examples_in_input_order():
    spill = make_spill([[1] * 4, [1] * 3, [1] * 6, [1] * 2, [1] * 5])
    raw = plan_packs(spill.lengths, 8, "bfd")
    plan = finalize_plan(spill, raw, np.arange(5))
    assert segments(plan) == [[(2, 0, 6), (3, 0, 2)], [(4, 0, 5), (1, 0, 3)], [(0, 0, 4)]]
    assert plan.example_id.tolist() == [2, 3, 4, 1, 0]
    assert plan.seg_targets.tolist() == [5, 1, 4, 2, 3]
    assert plan.seg_part.tolist() == [0] * 5
    assert plan.row_tokens().tolist() == [8, 8, 4]
    assert plan.segment_rows().tolist() == [0, 0, 1, 1, 2]
    assert plan.parts_dropped == 0 and plan.examples_dropped.size == 0
    assert (plan.strategy, plan.max_seq_len) == ("bfd", 8)  # taken from the raw plan
    assert plan.lower_bound_rows == 3 and plan.fill_rate == 20 / 24


def test_from_segments_builds_a_planner_plan():
    spill = make_spill([[1] * 4, [1] * 3, [1] * 6, [1] * 2, [1] * 5])
    raw = RowPlan.from_segments(
        np.array([0, 2, 4, 5]),
        np.array([2, 3, 4, 1, 0]),
        np.zeros(5, np.int64),
        np.array([6, 2, 5, 3, 4], np.int32),
        8,
        "bfd",
    )
    assert (raw.num_rows, raw.num_segments, raw.num_tokens) == (3, 5, 20)
    assert raw.seg_part.tolist() == raw.seg_targets.tolist() == raw.example_id.tolist() == [0] * 5
    assert raw.examples_dropped.size == 0 and raw.parts_dropped == 0
    planned = plan_packs(spill.lengths, 8, "bfd")
    assert segments(raw) == segments(planned)
    by_hand, by_planner = (finalize_plan(spill, p, np.arange(5)) for p in (raw, planned))
    for name in ("row_offsets", "seg_example", "seg_part", "seg_targets", "example_id"):
        assert np.array_equal(getattr(by_hand, name), getattr(by_planner, name)), name


def test_wrapped_plan_numbers_parts_and_drops_targetless_ones():
    # L = 4 over lengths 3, 6, 2: stream [a a a b | b b b b | b c c]; b's last part "b" is
    # one token (its only label masked) and c's labels are all masked after its first.
    spill = make_spill([[X, 1, 1], [X, 1, 1, 1, 1, X], [X, X]])
    raw = plan_packs(spill.lengths, 4, "wrapped")
    assert segments(raw) == [[(0, 0, 3), (1, 0, 1)], [(1, 1, 4)], [(1, 5, 1), (2, 0, 2)]]
    plan = finalize_plan(spill, raw, np.arange(3))
    # b part 0 ([X]) has no target either: dropped; the last row is left with nothing
    assert segments(plan) == [[(0, 0, 3)], [(1, 1, 4)]]
    assert plan.seg_part.tolist() == [0, 1]
    assert plan.seg_targets.tolist() == [2, 3]
    assert plan.example_id.tolist() == [0, 1]
    assert plan.parts_dropped == 3
    assert plan.examples_dropped.tolist() == [2]
    assert (plan.strategy, plan.max_seq_len) == ("wrapped", 4)


def test_segment_targets_across_blocks(monkeypatch):
    spill = make_spill([[X, 1, 1, X, 1], [1, 1, 1], [X, X, 1, 1]])
    starts = np.array([0, 2, 5, 6, 8, 9])
    lengths = np.array([5, 3, 3, 1, 2, 2])
    expected = [3, 1, 2, 0, 0, 1]  # first label of every range excluded
    assert segment_targets(spill, starts, lengths).tolist() == expected
    monkeypatch.setattr(plan_module, "TARGET_BLOCK_TOKENS", 3)
    assert segment_targets(spill, starts, lengths).tolist() == expected


def test_rows_and_permute_rows():
    spill = make_spill([[1] * k for k in (4, 3, 6, 2, 5)])
    plan = finalize_plan(spill, plan_packs(spill.lengths, 8, "bfd"), np.arange(5))
    sub = plan.rows(1, 3)
    assert sub.row_offsets.tolist() == [0, 2, 3]
    assert segments(sub) == [[(4, 0, 5), (1, 0, 3)], [(0, 0, 4)]]
    permuted = plan.permute_rows(np.array([2, 0, 1]))
    assert segments(permuted) == [segments(plan)[2], segments(plan)[0], segments(plan)[1]]
    assert permuted.example_id.tolist() == [0, 2, 3, 4, 1]  # ids travel with segments


def test_without_frees_what_the_shards_do_not_read():
    spill = make_spill([[1] * k for k in (4, 3, 6, 2, 5)])
    plan = finalize_plan(spill, plan_packs(spill.lengths, 8, "bfd"), np.arange(5)).narrowed()
    lean = plan.without("seg_part", "seg_targets")
    assert lean.seg_part.size == lean.seg_targets.size == 0
    assert lean.seg_part.dtype == plan.seg_part.dtype
    assert segments(lean.rows(1, 3)) == segments(plan.rows(1, 3))  # what the shards read
    assert lean.rows(1, 3).example_id.tolist() == plan.rows(1, 3).example_id.tolist()


def test_compacted_keeps_the_values_in_the_smallest_type():
    spill = make_spill([[1] * k for k in (4, 3, 6, 2, 5)])
    plan = finalize_plan(spill, plan_packs(spill.lengths, 8, "bfd"), np.arange(5)).narrowed()
    small = plan.compacted("seg_part", "seg_start")
    assert small.seg_part.dtype == small.seg_start.dtype == np.int8
    assert small.seg_part.tolist() == plan.seg_part.tolist()
    assert small.seg_start.tolist() == plan.seg_start.tolist()
    # zeros only (nothing split): one zero broadcast, no byte a segment; other values kept
    assert small.seg_start.strides == (0,) and not small.seg_start.flags.writeable
    tight = plan.compacted("seg_length")
    assert (
        tight.seg_length.strides == (1,) and tight.seg_length.tolist() == plan.seg_length.tolist()
    )
    assert small.rows(1, 2).seg_part.tolist() == [0] * int(np.diff(plan.row_offsets)[1])


def test_concatenate_renumbers_in_input_order():
    spill = make_spill([[1] * k for k in (4, 3, 6, 2, 5)])
    parts = []
    for index in (np.array([0, 2, 4]), np.array([1, 3])):  # e.g. two domains
        raw = plan_packs(spill.lengths[index], 8, "bfd")
        parts.append(finalize_plan(spill, raw, index))
    joined = RowPlan.concatenate(parts)
    assert segments(joined) == [[(2, 0, 6)], [(4, 0, 5)], [(0, 0, 4)], [(1, 0, 3), (3, 0, 2)]]
    assert joined.example_id.tolist() == [2, 4, 0, 1, 3]


def test_number_examples_orders_by_example_then_start():
    spill = make_spill([[1] * 9, [1] * 2])
    plan = finalize_plan(spill, plan_packs(spill.lengths, 4, "wrapped"), np.arange(2))
    shuffled = plan.permute_rows(np.array([2, 0, 1]))
    renumbered = number_examples(shuffled)
    assert renumbered.example_id.tolist() == shuffled.example_id.tolist()
    order = np.argsort(renumbered.example_id)
    keys = list(zip(renumbered.seg_example[order], renumbered.seg_start[order], strict=True))
    assert keys == sorted(keys)


def test_ordering_stats_by_hand():
    spill = make_spill([[1] * k for k in (4, 3, 6, 2, 5)])
    plan = finalize_plan(spill, plan_packs(spill.lengths, 8, "bfd"), np.arange(5))
    # 3 rows: a decile is 1 row; first row holds 6 and 2, last row 4
    assert ordering_stats(plan) == {
        "segments_per_row_mean": round(5 / 3, 4),
        "first_decile_mean_example_len": 4.0,
        "last_decile_mean_example_len": 4.0,
    }
    empty = finalize_plan(make_spill([]), plan_packs(np.zeros(0, np.int64), 8), np.arange(0))
    assert empty.num_rows == 0
    assert ordering_stats(empty)["segments_per_row_mean"] == 0.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.booleans(), min_size=1, max_size=40), min_size=1, max_size=30),
    st.integers(2, 32),
    st.sampled_from(["bfd", "ffd", "wrapped"]),
    st.integers(0, 2**32 - 1),
)
def test_plan_properties(trained, max_seq_len, strategy, seed):
    labels = [[1 if t else X for t in ex] for ex in trained]
    if strategy != "wrapped":  # what reaches bfd/ffd fits and has a target (ingest, spill)
        labels = [[*[X, *lab][: max_seq_len - 1], 1] for lab in labels]
    spill = make_spill(labels)
    raw = plan_packs(spill.lengths, max_seq_len, strategy)
    plan = finalize_plan(spill, raw, np.arange(len(labels)))
    plan = plan.permute_rows(np.random.default_rng(seed).permutation(plan.num_rows))
    assert np.all(plan.row_tokens() <= max_seq_len) and np.all(np.diff(plan.row_offsets) > 0)
    assert sorted(plan.example_id.tolist()) == list(range(plan.num_segments))
    assert np.all(plan.seg_targets > 0)
    kept = {}
    for ex, start, length, part in zip(
        plan.seg_example, plan.seg_start, plan.seg_length, plan.seg_part, strict=True
    ):
        kept.setdefault(int(ex), []).append((int(start), int(length), int(part)))
    for ex, lab in enumerate(labels):
        pieces = sorted(kept.get(ex, []))
        if strategy != "wrapped":
            targets = sum(v != X for v in lab[1:])
            assert pieces == [(0, len(lab), 0)]  # every example placed once, whole
            assert plan.seg_targets[plan.seg_example == ex].tolist() == [targets]
            continue
        # wrapped: the kept pieces are disjoint, ordered parts of the example; each dropped
        # piece had no target (its labels after the first are all masked)
        assert [p[2] for p in pieces] == sorted(p[2] for p in pieces)
        ends = [s + n for s, n, _ in pieces]
        assert all(e <= s for e, (s, _, _) in zip(ends, pieces[1:], strict=False))
        covered = np.zeros(len(lab), dtype=bool)
        for s, n, _ in pieces:
            covered[s : s + n] = True
            assert any(v != X for v in lab[s + 1 : s + n])
        if not pieces:
            assert ex in plan.examples_dropped.tolist()
    if strategy == "wrapped":
        assert plan.parts_dropped == raw.num_segments - plan.num_segments
    else:
        assert plan.num_rows == raw.num_rows


@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
def test_permuted_plan_keeps_every_segment(strategy):
    rng = np.random.default_rng(0)
    spill = make_spill([[1] * int(k) for k in rng.integers(1, 50, size=200)])
    plan = finalize_plan(spill, plan_packs(spill.lengths, 64, strategy), np.arange(200))
    permuted = plan.permute_rows(rng.permutation(plan.num_rows))
    assert sorted(map(tuple, segments(permuted))) == sorted(map(tuple, segments(plan)))


FIELDS = ("seg_example", "seg_start", "seg_length", "seg_part", "seg_targets", "example_id")


@pytest.mark.parametrize("strategy", ["bfd", "ffd", "sequential", "wrapped"])
def test_finalize_without_an_index_equals_the_identity_index(strategy):
    rng = np.random.default_rng(1)
    spill = make_spill([[1, X, 1][: int(k) % 3 + 1] * int(k) for k in rng.integers(1, 17, 300)])
    wide = finalize_plan(spill, plan_packs(spill.lengths, 48, strategy), np.arange(300))
    none = finalize_plan(spill, plan_packs(spill.lengths, 48, strategy))
    assert np.array_equal(none.row_offsets, wide.row_offsets)
    for name in FIELDS:
        assert np.array_equal(getattr(none, name), getattr(wide, name)), name
    if strategy in ("bfd", "ffd"):  # every example once, in input order: one array for both
        assert none.example_id is none.seg_example


@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
def test_consumed_permutation_equals_the_copied_one(strategy):
    rng = np.random.default_rng(2)
    spill = make_spill([[1] * int(k) for k in rng.integers(1, 50, size=400)])
    order = rng.permutation(finalize_plan(spill, plan_packs(spill.lengths, 64, strategy)).num_rows)
    copied = finalize_plan(spill, plan_packs(spill.lengths, 64, strategy)).permute_rows(order)
    given_up = finalize_plan(spill, plan_packs(spill.lengths, 64, strategy))
    arrays = {name: getattr(given_up, name) for name in FIELDS}
    moved = given_up.permute_rows(order, consume=True)
    assert np.array_equal(moved.row_offsets, copied.row_offsets)
    for name in FIELDS:
        assert np.array_equal(getattr(moved, name), getattr(copied, name)), name
        assert getattr(moved, name) is arrays[name]  # reordered where it was: no second plan
    plan = finalize_plan(spill, plan_packs(spill.lengths, 64, strategy))
    owner = np.repeat(plan.seg_length, 2)
    snapshot = owner.copy()
    moved = replace(plan, seg_length=owner[::2]).permute_rows(order, consume=True)
    assert np.array_equal(owner, snapshot)  # a view is copied, its owner left alone
    assert np.array_equal(moved.seg_length, copied.seg_length)
