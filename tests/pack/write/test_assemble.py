"""Shard assembly by hand: the columns of planned rows, gathered from the spill."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pytest

from packshard.format.shards import SHARD_SCHEMA, read_row
from packshard.pack.plan.planner import plan_packs
from packshard.pack.plan.rows import RowPlan, finalize_plan
from packshard.pack.spill import Spill
from packshard.pack.write.assemble import assemble_ranges, assemble_rows, fill_tokens
from packshard.records import IGNORE_INDEX as X
from tests.helpers import make_spill

LENGTHS = [2, 2, 2, 5, 6, 1, 1, 5, 1, 1]  # example i holds tokens 100*i, 100*i + 1, …


def toy_spill() -> Spill:
    return make_spill([[100 * i + k for k in range(n)] for i, n in enumerate(LENGTHS)])


def block(
    row_offsets: list[int],
    seg_example: list[int],
    seg_start: list[int],
    seg_length: list[int],
    example_id: list[int],
) -> RowPlan:
    """A plan of the given segments and example ids (parts and targets do not matter here)."""
    plan = RowPlan.from_segments(
        np.array(row_offsets, dtype=np.int64),
        np.array(seg_example, dtype=np.int64),
        np.array(seg_start, dtype=np.int64),
        np.array(seg_length, dtype=np.int64),
        16,
        "bfd",
    )
    return replace(plan, example_id=np.array(example_id, dtype=np.int64))


def assemble(segments: list[list[tuple[int, int, int]]], ids: list[list[int]]) -> pa.Table:
    flat = [s for row in segments for s in row]
    row_offsets = np.concatenate(([0], np.cumsum([len(r) for r in segments]))).tolist()
    return assemble_rows(
        toy_spill(),
        block(
            row_offsets,
            [s[0] for s in flat],
            [s[1] for s in flat],
            [s[2] for s in flat],
            [e for row in ids for e in row],
        ),
    )


def test_assemble_rows_as_drawn_in_the_docstring():
    # segments [ex7 0:5] [ex2 0:2] [ex9 0:1] | [ex4 0:6] [ex1 0:2], plus a wrapped part [ex3 2:5]
    table = assemble(
        [[(7, 0, 5), (2, 0, 2), (9, 0, 1)], [(4, 0, 6), (1, 0, 2)], [(3, 2, 3)]],
        [[17, 12, 19], [14, 11], [13]],
    )
    assert table.schema == SHARD_SCHEMA
    assert table.to_pydict() == {
        "input_ids": [
            [700, 701, 702, 703, 704, 200, 201, 900],
            [400, 401, 402, 403, 404, 405, 100, 101],
            [302, 303, 304],
        ],
        "labels": [
            [X, 701, 702, 703, 704, X, 201, X],
            [X, 401, 402, 403, 404, 405, X, 101],
            [X, 303, 304],
        ],
        "position_ids": [[0, 1, 2, 3, 4, 0, 1, 0], [0, 1, 2, 3, 4, 5, 0, 1], [0, 1, 2]],
        "cu_seqlens": [[0, 5, 7, 8], [0, 6, 8], [0, 3]],
        "example_ids": [[17, 12, 19], [14, 11], [13]],
        "num_tokens": [8, 8, 3],
        "num_loss_tokens": [5, 6, 2],
        "max_seqlen": [5, 6, 3],
    }


def test_assemble_rows_keeps_already_masked_labels():
    spill = toy_spill()
    spill.labels[spill.offsets[4] : spill.offsets[4] + 3] = X  # a prompt of 3 tokens
    table = assemble_rows(spill, block([0, 2], [4, 0], [0, 0], [6, 2], [0, 1]))
    row = read_row(table, 0)
    assert row.labels.tolist() == [X, X, X, 403, 404, 405, X, 1]
    assert table["num_loss_tokens"].to_pylist() == [4]


def test_assemble_no_rows():
    table = assemble_rows(toy_spill(), block([0], [], [], [], []))
    assert table.num_rows == 0 and table.schema == SHARD_SCHEMA


def test_assemble_a_slice_of_a_finalized_plan():
    spill = toy_spill()
    plan = finalize_plan(spill, plan_packs(spill.lengths, 8, "bfd"), np.arange(len(LENGTHS)))
    whole = assemble_rows(spill, plan.rows(0, plan.num_rows))
    assert whole.num_rows == plan.num_rows
    assert whole["num_tokens"].to_pylist() == plan.row_tokens().tolist()
    for lo, hi in ((0, 1), (1, plan.num_rows), (2, 2)):
        assert (
            assemble_rows(spill, plan.rows(lo, hi)).to_pydict()
            == whole.slice(lo, hi - lo).to_pydict()
        )
    for r in range(plan.num_rows):
        row = read_row(whole, r)
        segs = slice(int(plan.row_offsets[r]), int(plan.row_offsets[r + 1]))
        assert row.example_ids.tolist() == plan.example_id[segs].tolist()
        assert np.diff(row.cu_seqlens).tolist() == plan.seg_length[segs].tolist()
        # every token is the example's own (100 * example + k), segments start at 0
        expected = [
            100 * int(e) + k
            for e, n in zip(plan.seg_example[segs], plan.seg_length[segs], strict=True)
            for k in range(int(n))
        ]
        assert row.input_ids.tolist() == expected


def test_rows_assembled_in_pieces_are_the_same_table():
    rng = np.random.default_rng(3)
    spill = make_spill(
        [[X] + [int(t) for t in rng.integers(0, 9, int(n))] for n in rng.integers(0, 7, 300)]
    )
    plan = finalize_plan(spill, plan_packs(spill.lengths, 16, "bfd"))
    starts = spill.offsets[plan.seg_example] + plan.seg_start
    codes = rng.integers(0, 5, plan.num_segments).astype(np.int8)
    whole = assemble_ranges(spill.read_ranges, starts, plan, codes)
    whole.validate(full=True)
    assert whole["num_tokens"].to_pylist() == plan.row_tokens().tolist()
    for cuts in (
        [0, 1, plan.num_rows],
        [0, 7, 8, 30, plan.num_rows],
        list(range(plan.num_rows + 1)),
    ):
        pieced = assemble_ranges(spill.read_ranges, starts, plan, codes, cuts)
        assert pieced.equals(whole), cuts
        assert all(column.num_chunks == 1 for column in pieced.columns)


@pytest.mark.parametrize("jitted", [True, False], ids=["jitted", "python"])
@pytest.mark.parametrize("seed", range(3))
def test_fill_tokens_writes_what_the_columns_say(jitted, seed):
    rng = np.random.default_rng(seed)
    seg_len = rng.integers(0, 7, 30).astype(np.int64)  # empty segments too
    row_offsets = np.unique(np.concatenate(([0, 30], rng.integers(0, 30, 6)))).astype(np.int64)
    total = int(seg_len.sum())
    ids = rng.integers(0, 50, total).astype(np.int32)
    labels = np.where(rng.random(total) < 0.4, X, ids).astype(np.int32)
    labels[0] = ids[0]  # a first label that trains: masked at its seam
    out = [np.full(total, 9, np.int32) for _ in range(3)]
    num_loss = np.full(len(row_offsets) - 1, -1, np.int64)
    kernel = fill_tokens if jitted else fill_tokens.py_func
    kernel(ids, labels, seg_len, row_offsets, *out, num_loss)
    starts = np.concatenate(([0], np.cumsum(seg_len)[:-1]))
    want_labels = labels.copy()
    want_labels[starts[seg_len > 0]] = X
    want_positions = np.concatenate([np.arange(n) for n in seg_len]).astype(np.int32)
    row_tok = np.concatenate(([0], np.cumsum(seg_len)))[row_offsets]
    want_loss = [int((want_labels[a:b] != X).sum()) for a, b in pairwise(row_tok.tolist())]
    assert out[0].tolist() == ids.tolist()
    assert out[1].tolist() == want_labels.tolist()
    assert out[2].tolist() == want_positions.tolist()
    assert num_loss.tolist() == want_loss
    assert out[1][0] == X != labels[0]  # the control: the seam's target was there to mask
