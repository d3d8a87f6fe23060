"""The parent's tokens scattered to their new places: one jitted pass copies and counts.

:func:`scatter_segments` copies every segment of a row group to its place and counts its
targets as it goes; checked against the plain copy and :func:`count_trained` it replaces,
jitted and as Python.  Folded (each label in its token, one file) and unfolded again
(:func:`unfold_labels`), the tokens and labels are the ones copied.
"""

from __future__ import annotations

import numpy as np
import pytest

from packshard.arrays import count_trained, exclusive_cumsum
from packshard.pack.units.parts import unfold_labels
from packshard.records import IGNORE_INDEX
from packshard.repack.tokens import scatter_segments


def row_group(seed: int, segments: int):
    """Tokens and labels of ``segments`` segments (some empty), about half the labels masked."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 9, segments).astype(np.int64)
    total = int(lengths.sum())
    ids = rng.integers(0, 1000, total).astype(np.int32)
    labels = np.where(rng.random(total) < 0.5, IGNORE_INDEX, ids).astype(np.int32)
    return ids, labels, lengths


@pytest.mark.parametrize("jitted", [True, False], ids=["jitted", "python"])
@pytest.mark.parametrize("seed", range(4))
def test_each_segment_lands_at_its_place_with_its_targets_counted(jitted, seed):
    ids, labels, lengths = row_group(seed, 40)
    starts = exclusive_cumsum(lengths)
    rng = np.random.default_rng(100 + seed)
    order = rng.permutation(len(lengths))  # the new order of the segments
    at = np.empty(len(lengths), np.int64)
    at[order] = exclusive_cumsum(lengths[order])[:-1]
    skipped = rng.random(len(lengths)) < 0.2  # -1: checked, not copied
    at[skipped] = -1
    total = int(starts[-1])
    out_ids = np.full(total, 7, np.int32)
    out_labels = np.full(total, 7, np.int32)
    trained = np.full(len(lengths), -1, np.int64)
    kernel = scatter_segments if jitted else scatter_segments.py_func
    kernel(ids, labels, starts[:-1], lengths, at, out_ids, out_labels, trained)
    assert trained.tolist() == count_trained(labels, starts).tolist()
    want_ids = np.full(total, 7, np.int32)
    want_labels = np.full(total, 7, np.int32)
    for i in np.flatnonzero(~skipped):
        lo, n, to = int(starts[i]), int(lengths[i]), int(at[i])
        want_ids[to : to + n] = ids[lo : lo + n]
        want_labels[to : to + n] = labels[lo : lo + n]
    assert np.array_equal(out_ids, want_ids) and np.array_equal(out_labels, want_labels)
    # the control: a skipped segment with tokens leaves its place untouched
    assert (skipped & (lengths > 0)).any() and (out_ids == 7).any()


def test_a_first_label_that_trains_is_not_counted():
    ids = np.array([5, 6, 7], np.int32)
    labels = ids.copy()  # every label a target, the first one too
    trained = np.zeros(1, np.int64)
    out = np.zeros(3, np.int32), np.zeros(3, np.int32)
    scatter_segments(ids, labels, np.array([0]), np.array([3]), np.array([0]), *out, trained)
    assert trained.tolist() == [2]
    assert out[0].tolist() == [5, 6, 7] and out[1].tolist() == [5, 6, 7]


@pytest.mark.parametrize("jitted", [True, False], ids=["jitted", "python"])
def test_folded_segments_unfold_to_their_tokens_and_labels(jitted):
    ids, labels, lengths = row_group(7, 50)
    starts = exclusive_cumsum(lengths)
    order = np.random.default_rng(8).permutation(len(lengths))
    at = np.empty(len(lengths), np.int64)
    at[order] = exclusive_cumsum(lengths[order])[:-1]
    total = int(starts[-1])
    folded = np.zeros(total, np.int32)
    trained = np.zeros(len(lengths), np.int64)
    kernel = scatter_segments if jitted else scatter_segments.py_func
    kernel(ids, labels, starts[:-1], lengths, at, folded, np.zeros(0, np.int32), trained, True)
    assert trained.tolist() == count_trained(labels, starts).tolist()
    assert (folded < 0).any() and (folded > 0).any()  # both kinds are there to unfold
    got_labels = np.zeros(total, np.int32)
    (unfold_labels if jitted else unfold_labels.py_func)(folded, got_labels)
    for i in range(len(lengths)):
        lo, n, to = int(starts[i]), int(lengths[i]), int(at[i])
        assert folded[to : to + n].tolist() == ids[lo : lo + n].tolist()
        assert got_labels[to : to + n].tolist() == labels[lo : lo + n].tolist()
