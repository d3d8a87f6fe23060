"""The capped planner: a hand-computed plan, caps that hold, kernel == reference, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packshard.errors import UsageError
from packshard.options import VisionCaps
from packshard.pack.plan.planner import plan_packs
from packshard.pack.plan.rows import RowPlan
from packshard.pack.plan.vision import over_caps, plan_capped, plan_capped_reference
from tests.pack.plan.test_planner import assert_same, rows_of


def per_row(plan: RowPlan, values: np.ndarray) -> np.ndarray:
    """Sum ``values`` (per example) over each row of ``plan``."""
    return np.bincount(
        plan.segment_rows(), weights=values[plan.seg_example], minlength=plan.num_rows
    )


def test_the_docstring_plan() -> None:
    # L = 1024, 2 images and 600 vision tokens a row: e1 and e2 cannot join e0 (500 vision)
    plan = plan_capped(
        [700, 400, 300, 300], [1, 1, 1, 0], [500, 300, 200, 0], 1024, "bfd", VisionCaps(2, 600)
    )
    assert rows_of(plan) == [[(0, 0, 700)], [(1, 0, 400), (2, 0, 300), (3, 0, 300)]]
    # without caps the same examples take the plain best fit: 700 + 300 | 400 + 300
    plain = plan_packs(np.array([700, 400, 300, 300]), 1024, "bfd")
    assert rows_of(plain) == [[(0, 0, 700), (2, 0, 300)], [(1, 0, 400), (3, 0, 300)]]
    assert per_row(plain, np.array([500, 300, 200, 0])).max() == 700  # over the cap: a control


def test_sequential_keeps_input_order_and_opens_a_row_at_a_cap() -> None:
    plan = plan_capped(
        [10, 10, 10, 10], [1, 1, 0, 1], [5, 5, 0, 5], 100, "sequential", VisionCaps(2, 0)
    )
    assert rows_of(plan) == [[(0, 0, 10), (1, 0, 10), (2, 0, 10)], [(3, 0, 10)]]
    assert_same(
        plan,
        plan_capped_reference(
            [10, 10, 10, 10], [1, 1, 0, 1], [5, 5, 0, 5], 100, "sequential", VisionCaps(2, 0)
        ),
    )


@st.composite
def examples(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, VisionCaps]:
    big = draw(st.integers(8, 120))
    n = draw(st.integers(0, 60))
    lengths = np.array(draw(st.lists(st.integers(1, big), min_size=n, max_size=n)), np.int64)
    images = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.int64)
    share = np.array(draw(st.lists(st.integers(1, 30), min_size=n, max_size=n)), np.int64)
    vision = np.minimum(lengths, images * share)
    caps = VisionCaps(draw(st.integers(0, 4)), draw(st.integers(0, 60)))
    if not caps.active:
        caps = VisionCaps(images=2)
    keep = ~over_caps(caps, images, vision)
    return lengths[keep], images[keep], vision[keep], big, caps


@settings(max_examples=300, deadline=None)
@given(examples(), st.sampled_from(["bfd", "sequential"]))
def test_kernel_equals_reference_and_caps_hold(case, strategy) -> None:
    lengths, images, vision, big, caps = case
    plan = plan_capped(lengths, images, vision, big, strategy, caps)
    assert_same(plan, plan_capped_reference(lengths, images, vision, big, strategy, caps))
    assert sorted(plan.seg_example.tolist()) == list(range(len(lengths)))  # each placed once
    assert (per_row(plan, lengths) <= big).all()
    if caps.images:
        assert (per_row(plan, images) <= caps.images).all()
    if caps.tokens:
        assert (per_row(plan, vision) <= caps.tokens).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 64), max_size=200), st.integers(64, 200))
def test_caps_that_never_bind_give_the_plain_plan(lengths, big) -> None:
    values = np.array(lengths, np.int64)
    zeros = np.zeros(len(values), np.int64)
    plan = plan_capped(values, zeros, zeros, big, "bfd", VisionCaps(1, 1))
    assert_same(plan, plan_packs(values, big, "bfd"))


def test_a_binding_cap_changes_the_plan_a_control() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 900, 2000)
    images = rng.integers(1, 3, 2000)
    vision = images * rng.integers(20, 90, 2000)
    caps = VisionCaps(3, 300)
    plain = plan_packs(lengths, 4096, "bfd")
    assert per_row(plain, images).max() > 3 and per_row(plain, vision).max() > 300
    capped = plan_capped(lengths, images, vision, 4096, "bfd", caps)
    assert per_row(capped, images).max() <= 3 and per_row(capped, vision).max() <= 300


def test_refusals() -> None:
    with pytest.raises(UsageError, match="--strategy ffd does not take"):
        plan_capped([1], [1], [1], 8, "ffd", VisionCaps(1, 0))
    with pytest.raises(UsageError, match="alone exceeds a vision cap"):
        plan_capped([8], [2], [4], 8, "bfd", VisionCaps(1, 0))
    with pytest.raises(UsageError, match=r"outside 1\.\.8"):
        plan_capped([9], [0], [0], 8, "bfd", VisionCaps(1, 0))
    with pytest.raises(UsageError, match="--max-images-per-row must be a positive"):
        VisionCaps(-1, 0).check("bfd")
    with pytest.raises(UsageError, match="use --strategy bfd or sequential"):
        VisionCaps(0, 5).check("wrapped")
    VisionCaps().check("wrapped")  # no caps: every strategy


def test_over_caps() -> None:
    images, vision = np.array([0, 1, 3, 1]), np.array([0, 40, 90, 200])
    assert over_caps(VisionCaps(2, 0), images, vision).tolist() == [False, False, True, False]
    assert over_caps(VisionCaps(0, 100), images, vision).tolist() == [False, False, False, True]
    assert over_caps(VisionCaps(), images, vision).tolist() == [False] * 4
