"""The vectorised seam audit on hand-built shards: each fault, its finding and its place.

The good shard (``-`` = -100)::

    row 0  ids    10 11 12 | 20 21        cu [0, 3, 5]   examples [0, 1]
           labels  -  11 12 |  -  21      positions 0 1 2 | 0 1
    row 1  ids    30 31 32 33             cu [0, 4]      examples [2]
           labels  -   -  32 33           positions 0 1 2 3
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from packshard.format.examples import ExamplesIndex
from packshard.format.shards import SHARD_SCHEMA
from packshard.verify.findings import FindingList
from packshard.verify.structure import audit_shard, check_structure

M = -100


def good_rows() -> list[dict[str, Any]]:
    return [
        {
            "input_ids": [10, 11, 12, 20, 21],
            "labels": [M, 11, 12, M, 21],
            "position_ids": [0, 1, 2, 0, 1],
            "cu_seqlens": [0, 3, 5],
            "example_ids": [0, 1],
            "num_tokens": 5,
            "num_loss_tokens": 3,
            "max_seqlen": 3,
        },
        {
            "input_ids": [30, 31, 32, 33],
            "labels": [M, M, 32, 33],
            "position_ids": [0, 1, 2, 3],
            "cu_seqlens": [0, 4],
            "example_ids": [2],
            "num_tokens": 4,
            "num_loss_tokens": 2,
            "max_seqlen": 4,
        },
    ]


def index(**overrides: list[Any]) -> ExamplesIndex:
    columns: dict[str, list[Any]] = {
        "example_id": [0, 1, 2],
        "shard": [0, 0, 0],
        "row": [0, 0, 1],
        "num_tokens": [3, 2, 4],
        "num_loss_tokens": [2, 1, 2],
        "token_offset": [0, 0, 0],
        "source": ["chat.jsonl"] * 3,
        "line": [4, 9, 12],
    }
    columns.update(overrides)
    return ExamplesIndex.from_table(pa.table(columns))


def audit(rows: list[dict[str, Any]], idx: ExamplesIndex | None = None, max_seq_len: int = 8):
    findings = FindingList()
    table = pa.Table.from_pylist(rows, schema=SHARD_SCHEMA)
    result = audit_shard(table, "s.parquet", 0, max_seq_len, idx or index(), findings)
    return result, [(f.message, f.row, f.segment, f.example_id, f.source) for f in findings.items]


def test_good_shard_has_no_findings_and_its_totals():
    result, found = audit(good_rows())
    assert found == []
    assert (result.rows, result.tokens, result.loss_tokens) == (2, 9, 5)
    assert result.segments.tolist() == [2, 1]
    assert result.example_ids.tolist() == [0, 1, 2]
    assert result.bad_rows.tolist() == [] and result.row_findings.tolist() == [0, 0]


def test_unmasked_seam_label():
    rows = good_rows()
    rows[0]["labels"][3] = 20
    rows[0]["num_loss_tokens"] = 4
    _, found = audit(rows)
    assert found == [
        (
            "first label of the segment is not -100 (a target crosses the seam)",
            0,
            1,
            1,
            "chat.jsonl:9",
        )
    ]


def test_first_label_of_the_row_counts_as_a_seam_too():
    rows = good_rows()
    rows[1]["labels"][0] = 30
    rows[1]["num_loss_tokens"] = 3
    _, found = audit(rows)
    assert found[0][:4] == ("first label of the segment is not -100 (a target crosses the seam)",
                            1, 0, 2)  # fmt: skip


def test_label_that_is_not_its_token():
    rows = good_rows()
    rows[1]["labels"][3] = 34
    _, found = audit(rows)
    assert found == [("a label is neither -100 nor its own token", 1, 0, 2, "chat.jsonl:12")]


def test_seq_lengths_are_checked_when_present():
    from packshard.format.shards import WRITTEN_SCHEMA

    def audit_written(seq_lengths: list[Any]) -> list[tuple[Any, ...]]:
        rows = [r | {"seq_lengths": s} for r, s in zip(good_rows(), seq_lengths, strict=True)]
        table = pa.Table.from_pylist(rows, schema=WRITTEN_SCHEMA)
        findings = FindingList()
        audit_shard(table, "s.parquet", 0, 8, index(), findings)
        return [(f.message, f.row) for f in findings.items]

    wrong = "seq_lengths is not diff(cu_seqlens) (TRL would train across the seams)"
    assert audit_written([[3, 2], [4]]) == []
    assert audit_written([[5], [4]]) == [(wrong, 0)]  # one seam merged away
    assert audit_written([[3, 2], [2, 2]]) == [(wrong, 1)]  # a seam invented
    assert audit_written([[2, 3], [4]]) == [(wrong, 0)]  # the seam moved
    assert audit_written([[3, 2], None]) == [(wrong, 1)]


def test_padded_boundaries_are_checked_against_the_recorded_alignment():
    from packshard.format.shards import written_schema

    def audit_padded(padded: list[Any] | None, multiple: int, max_seq_len: int = 8) -> list:
        rows = good_rows()
        if padded is not None:
            rows = [r | {"cu_seqlens_padded": p} for r, p in zip(rows, padded, strict=True)]
        schema = written_schema(pairs=False, padded=padded is not None)
        table = pa.Table.from_pylist([r | {"seq_lengths": None} for r in rows], schema=schema)
        table = table.drop_columns(["seq_lengths"])
        findings = FindingList()
        audit_shard(table, "s.parquet", 0, max_seq_len, index(), findings, multiple=multiple)
        return [(f.message, f.row) for f in findings.items]

    wrong = (
        "cu_seqlens_padded is not each segment rounded up to a multiple of 2 within max_seq_len 8"
    )
    assert audit_padded([[0, 4, 6], [0, 4]], 2) == []  # 3 → 4, 2 → 2, 4 → 4
    assert audit_padded([[0, 3, 5], [0, 4]], 2) == [(wrong, 0)]  # the control: not padded
    assert audit_padded([[0, 4, 6], [0, 6]], 2) == [(wrong, 1)]  # padded past the multiple
    assert audit_padded([[0, 4, 6], [0, 4]], 2, max_seq_len=5) == [
        (wrong.replace("max_seq_len 8", "max_seq_len 5"), 0)
    ]
    missing = "the manifest records an alignment of 2; the shard has no cu_seqlens_padded"
    assert audit_padded(None, 2) == [(missing, 0), (missing, 1)]
    stray = "cu_seqlens_padded in a pack that records no alignment (config.alignment)"
    assert audit_padded([[0, 4, 6], [0, 4]], 1) == [(stray, 0), (stray, 1)]


def test_position_not_reset():
    rows = good_rows()
    rows[0]["position_ids"] = [0, 1, 2, 3, 4]
    _, found = audit(rows)
    assert found == [("position_ids do not restart at 0 at this segment", 0, 1, 1, "chat.jsonl:9")]


def test_cu_seqlens_off_by_one_moves_the_seam():
    rows = good_rows()
    rows[0]["cu_seqlens"] = [0, 4, 5]
    rows[0]["max_seqlen"] = 4
    _, found = audit(rows)
    messages = {(m, r, s) for m, r, s, _, _ in found}
    assert messages == {
        ("position_ids do not restart at 0 at this segment", 0, 0),
        ("position_ids do not restart at 0 at this segment", 0, 1),
        ("first label of the segment is not -100 (a target crosses the seam)", 0, 1),
        ("examples.parquet disagrees with the shard (shard, row or token counts)", 0, 0),
        ("examples.parquet disagrees with the shard (shard, row or token counts)", 0, 1),
    }


@pytest.mark.parametrize(
    ("cu", "message"),
    [
        ([1, 3, 5], "cu_seqlens must start at 0 and end at num_tokens"),
        ([0, 3, 6], "cu_seqlens must start at 0 and end at num_tokens"),
        ([0, 3, 3, 5], "cu_seqlens and example_ids disagree on the number of segments"),
        ([0], "cu_seqlens and example_ids disagree on the number of segments"),
    ],
)
def test_bad_cu_seqlens_are_named(cu, message):
    rows = good_rows()
    rows[0]["cu_seqlens"] = cu
    _, found = audit(rows)
    assert (message, 0) in [(m, r) for m, r, *_ in found]


def test_cu_seqlens_not_increasing_names_the_entry():
    rows = good_rows()
    rows[0]["input_ids"] += [22]
    rows[0]["labels"] += [22]
    rows[0]["position_ids"] += [2]
    rows[0]["num_tokens"] = 6
    rows[0]["cu_seqlens"] = [0, 3, 3, 6]
    rows[0]["example_ids"] = [0, 1, 5]
    _, found = audit(rows)
    assert ("cu_seqlens is not strictly increasing", 0, 1) in [(m, r, s) for m, r, s, *_ in found]


def test_a_cu_seqlens_step_that_wraps_in_int32_is_a_finding_not_a_crash():
    rows = good_rows()
    rows[0]["cu_seqlens"] = [0, 2**31 - 1, -(2**31) + 10, 5]  # int32 diff would wrap positive
    rows[0]["example_ids"] = [0, 1, 5]
    _, found = audit(rows)
    assert ("cu_seqlens is not strictly increasing", 0, 1) in [(m, r, s) for m, r, s, *_ in found]


def test_empty_cu_seqlens_list_in_the_last_row_is_a_finding_not_a_crash():
    rows = good_rows()
    rows[1]["cu_seqlens"] = []
    rows[1]["example_ids"] = []
    _, found = audit(rows)
    assert ("cu_seqlens must start at 0 and end at num_tokens", 1) in [(m, r) for m, r, *_ in found]


def test_empty_row_is_a_finding():
    rows = good_rows()
    rows.append({k: ([] if isinstance(v, list) else 0) for k, v in rows[1].items()})
    rows[2]["cu_seqlens"] = [0]
    _, found = audit(rows)
    assert [r for _, r, *_ in found] and {r for _, r, *_ in found} == {2}


def test_lengths_that_disagree():
    rows = good_rows()
    rows[1]["labels"] = [M, M, 32]
    _, found = audit(rows)
    assert found == [
        ("input_ids, labels and position_ids have different lengths", 1, None, None, None)
    ]


def test_counts_and_capacity():
    rows = good_rows()
    rows[0]["num_tokens"] = 6
    rows[0]["num_loss_tokens"] = 2
    rows[1]["max_seqlen"] = 3
    _, found = audit(rows, max_seq_len=4)
    assert [(m, r) for m, r, *_ in found] == [
        ("num_tokens does not match the row's length", 0),
        ("row holds more than max_seq_len 4 tokens", 0),
    ]
    rows[0]["num_tokens"] = 5
    _, found = audit(rows)
    assert [(m, r) for m, r, *_ in found] == [
        ("num_loss_tokens does not match labels", 0),
        ("max_seqlen is not the longest segment", 1),
    ]


def test_examples_index_disagreements():
    _, found = audit(good_rows(), index(row=[0, 1, 0]))
    assert [(m[:24], r, s, e) for m, r, s, e, _ in found] == [
        ("examples.parquet disagre", 0, 1, 1),
        ("examples.parquet disagre", 1, 0, 2),
    ]
    rows = good_rows()
    rows[1]["example_ids"] = [7]
    _, found = audit(rows)
    assert found == [("example id not in examples.parquet", 1, 0, 7, None)]


def test_sparse_example_ids_are_looked_up():
    idx = index(example_id=[10, 11, 12])
    rows = good_rows()
    for row, ids in zip(rows, ([10, 11], [12]), strict=True):
        row["example_ids"] = ids
    _, found = audit(rows, idx)
    assert found == []


def test_findings_per_kind_are_capped_and_counted():
    rows = good_rows() * 30
    for row in rows[::2]:
        row["labels"] = [M, 11, 12, 20, 21]
        row["num_loss_tokens"] = 4
    findings = FindingList()
    table = pa.Table.from_pylist(rows, schema=SHARD_SCHEMA)
    audit_shard(table, "s.parquet", 0, 8, index(row=[0, 0, 1]), findings)
    seams = [f for f in findings.items if f.message.startswith("first label")]
    assert len(seams) == 20
    assert [f.row for f in seams[:3]] == [0, 2, 4]
    assert findings.overflow["structure:seam_label"] == 10  # 30 rows: 20 listed, 10 counted


def test_shard_read_as_several_chunks_is_audited_like_one():
    rows = good_rows()
    table = pa.concat_tables(
        [pa.Table.from_pylist(rows[:1], schema=SHARD_SCHEMA),
         pa.Table.from_pylist(rows[1:], schema=SHARD_SCHEMA)]
    )  # fmt: skip
    assert table["input_ids"].num_chunks == 2
    findings = FindingList()
    result = audit_shard(table, "s.parquet", 0, 8, index(), findings)
    assert len(findings) == 0 and result.tokens == 9
    sliced = pa.Table.from_pylist(rows + rows, schema=SHARD_SCHEMA).slice(2)
    findings = FindingList()
    result = audit_shard(sliced, "s.parquet", 0, 8, index(), findings)
    assert len(findings) == 0 and result.tokens == 9
    assert np.array_equal(result.example_ids, [0, 1, 2])


def test_token_ids_outside_the_vocabulary():
    rows = good_rows()
    rows[1]["input_ids"][1] = 64
    findings = FindingList()
    table = pa.Table.from_pylist(rows, schema=SHARD_SCHEMA)
    audit_shard(table, "s.parquet", 0, 8, index(), findings, vocab_size=64)
    assert [(f.message, f.row) for f in findings.items] == [
        ("token id outside the vocabulary [0, 64)", 1)
    ]
    findings = FindingList()
    audit_shard(table, "s.parquet", 0, 8, index(), findings, vocab_size=65)
    assert len(findings) == 0


def test_row_findings_count_every_fault_of_a_row():
    rows = good_rows()
    rows[0]["labels"][3] = 20  # seam label, and now num_loss_tokens is wrong too
    result, found = audit(rows)
    assert result.row_findings.tolist() == [2, 0] and result.bad_rows.tolist() == [0]
    assert len(found) == 2


# --- check_structure: every shard, then every example exactly once ---------------------------


def structure(tables: dict[int, pa.Table], idx: ExamplesIndex, shards: int | None = None):
    count = len(tables) if shards is None else shards
    manifest = {
        "config": {"max_seq_len": 8},
        "tokenizer": {"vocab_size": 64},
        "shards": [{"path": f"shard-{k:05d}.parquet"} for k in range(count)],
    }
    findings = FindingList()
    audits = check_structure(manifest, tables, idx, findings)
    return audits, findings


def test_check_structure_audits_every_shard_of_a_sound_folder():
    table = pa.Table.from_pylist(good_rows(), schema=SHARD_SCHEMA)
    audits, findings = structure({0: table}, index())
    assert len(findings) == 0 and list(audits) == [0]
    assert (audits[0].rows, audits[0].tokens, audits[0].loss_tokens) == (2, 9, 5)


def test_an_example_of_the_index_in_no_row_is_a_structure_finding():
    table = pa.Table.from_pylist(good_rows(), schema=SHARD_SCHEMA)
    orphan = index(
        example_id=[0, 1, 2, 3],
        shard=[0, 0, 0, 0],
        row=[0, 0, 1, 1],
        num_tokens=[3, 2, 4, 1],
        num_loss_tokens=[2, 1, 2, 0],
        token_offset=[0, 0, 0, 0],
        source=["chat.jsonl"] * 4,
        line=[4, 9, 12, 15],
    )
    _, findings = structure({0: table}, orphan)
    assert [(f.check, f.message, f.example_id, f.source) for f in findings.items] == [
        ("structure", "example listed in examples.parquet is in no row", 3, "chat.jsonl:15")
    ]
    assert findings.count_kind("structure", "missing_example") == 1


def test_past_the_cap_the_first_examples_are_listed_and_the_rest_counted():
    table = pa.Table.from_pylist(good_rows(), schema=SHARD_SCHEMA)
    n = 45  # examples 3..44 of the index are in no row: 42 missing, past the cap of 20
    orphans = index(
        example_id=list(range(n)),
        shard=[0] * n,
        row=[0, 0, 1] + [1] * (n - 3),
        num_tokens=[3, 2, 4] + [1] * (n - 3),
        num_loss_tokens=[2, 1, 2] + [0] * (n - 3),
        token_offset=[0] * n,
        source=["chat.jsonl"] * n,
        line=list(range(1, n + 1)),
    )
    _, findings = structure({0: table}, orphans)
    listed = [f.example_id for f in findings.items if f.message.endswith("is in no row")]
    assert listed == list(range(3, 23))
    assert findings.overflow["structure:missing_example"] == 22
    assert findings.count_kind("structure", "missing_example") == 42


def test_an_example_in_two_shards_is_a_structure_finding():
    table = pa.Table.from_pylist(good_rows(), schema=SHARD_SCHEMA)
    _, findings = structure({0: table, 1: table}, index())
    duplicated = [f for f in findings.items if f.message.startswith("example appears")]
    assert [(f.example_id, f.source) for f in duplicated] == [
        (0, "chat.jsonl:4"),
        (1, "chat.jsonl:9"),
        (2, "chat.jsonl:12"),
    ]
    assert {f.check for f in findings.items} == {"structure"}


def test_each_example_once_waits_for_every_shard_and_the_index():
    table = pa.Table.from_pylist(good_rows()[:1], schema=SHARD_SCHEMA)  # example 2 not read
    _, findings = structure({0: table}, index(), shards=2)  # shard 1 could not be opened
    assert len(findings) == 0
    _, findings = structure({0: table}, None)
    assert len(findings) == 0  # without the index nothing can be compared
