"""Counting once, at the end: the spill's, the rejects file's and the plan's counts combined.

The hand-made pack (L = 4, bfd, ``--overlong drop``)::

    a.jsonl (chat, messages)   1: [- x x]          3 tokens, 2 trained
                               2: 6 tokens         too_long, dropped
                               3: broken           invalid_json, rejected
    b.jsonl (code, text)       1: [y y]            2 tokens, 1 trained (the first is masked)
                               2: [z z z z]        4 tokens, 3 trained
                               9: domain "lost"    unknown_format, rejected

    rows   0: [z z z z]   1: [- x x]   2: [y y]        shards of 2 and 1 rows
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from packshard.format.rejects import RejectsWriter
from packshard.format.shards import ShardInfo
from packshard.ingest.types import TokenizedBatch
from packshard.pack.counts import (
    examples_tables,
    loss_policies,
    pack_stats,
    records_per_input,
    row_places,
    wrapped_drops,
)
from packshard.pack.plan.planner import plan_packs
from packshard.pack.plan.rows import finalize_plan
from packshard.pack.spill import SpillWriter
from packshard.records import IGNORE_INDEX as X
from packshard.records import Reject, SourceRef
from tests.helpers import make_spill


def batch(source, domain, fmt, examples):
    ids = np.array([t for e in examples for t in e], dtype=np.int32)
    labels = np.array([t for e in examples for t in e], dtype=np.int32)
    if fmt == "messages":
        labels[0] = X
    offsets = np.concatenate(([0], np.cumsum([len(e) for e in examples]))).astype(np.int64)
    refs = tuple(SourceRef(source, k + 1) for k in range(len(examples)))
    n = len(examples)
    return TokenizedBatch(ids, labels, offsets, refs, (domain,) * n, (fmt,) * n)


@pytest.fixture
def pack(tmp_path):
    writer = SpillWriter(tmp_path, 4, "drop", split_at_rows=False, sources=("a.jsonl", "b.jsonl"))
    with RejectsWriter(tmp_path / "rejects.jsonl") as rejects:
        rejects.write([Reject(SourceRef("a.jsonl", 3), "chat", "invalid_json", "broken")])
        rejects.write(writer.add(batch("a.jsonl", "chat", "messages", [[1, 1, 1], [2] * 6])))
        rejects.write(writer.add(batch("b.jsonl", "code", "text", [[5, 5], [7, 7, 7, 7]])))
        rejects.write([Reject(SourceRef("b.jsonl", 9), "lost", "unknown_format", "what")])
        spill = writer.finish()
        plan = finalize_plan(spill, plan_packs(spill.lengths, 4, "bfd"), np.arange(len(spill)))
        rejects.write(wrapped_drops(spill, plan))  # bfd: none
        tally = rejects.close()
    return spill, plan, tally


def test_the_plan_is_as_drawn(pack):
    spill, plan, _ = pack
    assert spill.lengths.tolist() == [3, 2, 4] and spill.loss_tokens.tolist() == [2, 1, 3]
    assert plan.seg_example.tolist() == [2, 0, 1] and plan.example_id.tolist() == [2, 0, 1]
    assert plan.examples_dropped.size == 0


def test_records_per_input_adds_what_ingest_rejected(pack):
    spill, _, tally = pack
    assert spill.counts.records_per_source == (2, 2)  # the dropped record was accepted
    assert records_per_input(spill, tally) == [3, 3]


def test_pack_stats_by_hand(pack):
    spill, plan, tally = pack
    ordering = {"segments_per_row_mean": 1.0}
    stats = pack_stats(spill, plan, tally, ordering)
    domains = stats.pop("domains")
    assert stats == {
        "records": 6,
        "records_packed": 3,
        "rejected": 2,
        "dropped": 1,
        "truncated": 0,
        "split": 0,
        "examples": 3,
        "rows": 3,
        "tokens": 9,
        "tokens_in": 15,
        "loss_tokens": 6,
        "lower_bound_rows": 3,
        "fill_rate": 0.75,
        "row_fill": {"min": 0.5, "p10": 0.5, "median": 0.75, "p90": 1.0, "max": 1.0},
        "step_loss_tokens": {  # rows train 3, 2 and 1 tokens; no step of 8 or 64 rows
            "1": {"steps": 3, "min": 1, "p10": 1, "median": 2, "p90": 3, "max": 3},
            "8": {"steps": 0, "min": 0, "p10": 0, "median": 0, "p90": 0, "max": 0},
            "64": {"steps": 0, "min": 0, "p10": 0, "median": 0, "p90": 0, "max": 0},
        },
        "ordering": ordering,
        "rejects_by_code": {"invalid_json": 1, "too_long": 1, "unknown_format": 1},
        "tokens_truncated": 0,
        "parts_dropped": 0,
    }
    assert list(domains) == ["chat", "code", "lost"]  # spill order, then reject-only domains
    assert domains["chat"] == {
        "records": 3,
        "rejected": 1,
        "dropped": 1,
        "records_packed": 1,
        "examples": 1,
        "tokens": 3,
        "loss_tokens": 2,
        "truncated": 0,
        "split": 0,
        "token_share_in": 0.6,
        "token_share_out": 0.333333,
    }
    assert domains["code"] == {
        "records": 2,
        "rejected": 0,
        "dropped": 0,
        "records_packed": 2,
        "examples": 2,
        "tokens": 6,
        "loss_tokens": 4,
        "truncated": 0,
        "split": 0,
        "token_share_in": 0.4,
        "token_share_out": 0.666667,
    }
    assert domains["lost"] == dict.fromkeys(domains["lost"], 0) | {
        "records": 1,
        "rejected": 1,
        "token_share_in": 0.0,
        "token_share_out": 0.0,
    }
    # the counting rule, in total and per domain
    for d in (stats, *domains.values()):
        assert d["records"] == d["records_packed"] + d["rejected"] + d["dropped"]


def test_examples_index_by_example_id(pack):
    spill, plan, _ = pack
    shards = [ShardInfo("s0", 2, 7, 5, 1, "x"), ShardInfo("s1", 1, 2, 1, 1, "y")]
    rows = [s.rows for s in shards]
    columns = pa.concat_tables(examples_tables(spill, plan, rows)).to_pydict()
    sources, domains = spill.counts.sources, spill.counts.domains
    assert columns == {
        "example_id": [0, 1, 2],
        "source": [sources[0], sources[1], sources[1]],
        "line": [1, 1, 2],
        "part": [0, 0, 0],
        "token_offset": [0, 0, 0],
        "domain": [domains[0], domains[1], domains[1]],
        "num_tokens": [3, 2, 4],
        "num_loss_tokens": [2, 1, 3],
        "truncated": [False, False, False],
        "shard": [0, 1, 0],
        "row": [1, 0, 0],
        "turn": [0, 0, 0],
    }


def test_row_places_name_each_rows_shard_and_place_in_it():
    shard, row = row_places([2, 0, 3, 1])  # an empty shard holds no row
    assert shard.tolist() == [0, 0, 2, 2, 2, 3]
    assert row.tolist() == [0, 1, 0, 1, 2, 0]
    assert shard.dtype == row.dtype == np.int32
    assert [a.size for a in row_places([])] == [0, 0]


def test_loss_policies_resolve_per_format(pack):
    spill, plan, _ = pack
    assert loss_policies(spill, plan, "auto") == (
        {"messages": "assistant", "text": "all"},
        {"all": 2, "assistant": 1},
    )
    assert loss_policies(spill, plan, "all") == (
        {"messages": "all", "text": "all"},
        {"all": 3},
    )


def test_wrapped_drops_name_records_without_any_part():
    spill = make_spill([[X, 1, 1], [X, 1, 1, 1, 1, X], [X, X]])
    plan = finalize_plan(spill, plan_packs(spill.lengths, 4, "wrapped"), np.arange(3))
    assert wrapped_drops(spill, plan) == (
        Reject(
            SourceRef("mem.jsonl", 3),
            "mem",
            "split_no_targets",
            "no part kept a target token (dropped)",
        ),
    )
