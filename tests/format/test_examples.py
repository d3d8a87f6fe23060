"""The examples index: built from codes, written with the dataset's metadata, read back checked."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packshard.errors import FormatError
from packshard.format.examples import (
    EXAMPLES_NAME,
    EXAMPLES_SCHEMA,
    ExamplesIndex,
    build_examples_table,
    read_examples,
    write_examples,
)

DATASET = "ab12" * 8


def columns(**overrides: list) -> dict[str, np.ndarray]:
    """Three examples; ``source`` and ``domain`` as codes."""
    values = {
        "example_id": [0, 1, 2],
        "source": [1, 0, 1],
        "line": [4, 9, 12],
        "part": [0, 0, 1],
        "token_offset": [0, 0, 256],
        "domain": [0, 0, 1],
        "num_tokens": [3, 2, 4],
        "num_loss_tokens": [2, 1, 2],
        "truncated": [False, True, False],
        "shard": [0, 0, 1],
        "row": [0, 0, 0],
    }
    values.update(overrides)
    return {k: np.array(v) for k, v in values.items()}


def table() -> pa.Table:
    return build_examples_table(columns(), ["a.jsonl", "b.jsonl"], ["chat", "code"])


def test_build_examples_table_names_the_codes():
    built = table()
    assert EXAMPLES_NAME == "examples.parquet"
    assert built.schema == EXAMPLES_SCHEMA
    assert built.column_names == list(EXAMPLES_SCHEMA.names)
    data = built.to_pydict()
    assert data["source"] == ["b.jsonl", "a.jsonl", "b.jsonl"]
    assert data["domain"] == ["chat", "chat", "code"]
    assert data["token_offset"] == [0, 0, 256] and data["truncated"] == [False, True, False]


def test_write_and_read_examples(tmp_path):
    path = tmp_path / EXAMPLES_NAME
    write_examples(path, table(), DATASET)
    meta = pq.read_schema(path).metadata
    assert meta == {b"packshard.format_version": b"1", b"packshard.dataset_id": DATASET.encode()}
    assert read_examples(path, DATASET).to_pydict() == table().to_pydict()
    assert read_examples(path, DATASET, ["line"]).column_names == ["line"]


def test_read_examples_refuses_another_dataset_and_missing_columns(tmp_path):
    path = tmp_path / EXAMPLES_NAME
    write_examples(path, table(), DATASET)
    with pytest.raises(FormatError) as info:
        read_examples(path, "cd34" * 8)
    assert info.value.path == str(path)
    assert info.value.problem.startswith(
        f"packshard.dataset_id {DATASET} differs from the manifest's {'cd34' * 8}"
    )
    pq.write_table(table().drop_columns(["row"]), path)  # no metadata either: that comes first
    with pytest.raises(FormatError, match=r"no packshard\.format_version in its Parquet metadata"):
        read_examples(path, DATASET)
    write_examples(path, table().drop_columns(["row", "shard"]), DATASET)
    with pytest.raises(FormatError) as info:
        read_examples(path, DATASET)
    assert info.value.problem == "missing columns shard, row"
    path.write_bytes(b"PAR1 but not really")
    with pytest.raises(FormatError, match=r"unreadable Parquet: "):
        read_examples(path, DATASET)


def test_index_from_the_table_keeps_sources_encoded():
    idx = ExamplesIndex.from_table(table())
    assert idx.dense and idx.example_id.tolist() == [0, 1, 2]
    assert idx.token_offset.tolist() == [0, 0, 256]
    assert idx.source_names == ("b.jsonl", "a.jsonl")
    assert idx.source_code.tolist() == [0, 1, 0]
    assert idx.sources == ["b.jsonl", "a.jsonl", "b.jsonl"]
    assert (idx.where(1), idx.where(2), idx.where(3)) == ("a.jsonl:9", "b.jsonl:12", None)
    assert idx.lookup(np.array([2, 0, 3, -1])).tolist() == [2, 0, -1, -1]


def index(**overrides: list) -> ExamplesIndex:
    return ExamplesIndex.from_table(
        build_examples_table(columns(**overrides), ["chat.jsonl"] * 2, ["chat", "code"])
    )


def test_sparse_index_lookup_and_where():
    idx = index(example_id=[12, 10, 11], source=[0, 0, 0])
    assert not idx.dense
    assert idx.lookup(np.array([10, 11, 12, 13, -1])).tolist() == [1, 2, 0, -1, -1]
    assert idx.where(12) == "chat.jsonl:4" and idx.where(99) is None
    dense = index(source=[0, 0, 0])
    assert dense.dense and dense.where(2) == "chat.jsonl:12" and dense.where(3) is None
    assert dense.sources == ["chat.jsonl"] * 3


def test_empty_index():
    empty = ExamplesIndex.from_table(EXAMPLES_SCHEMA.empty_table())
    assert empty.dense and len(empty.example_id) == 0
    assert empty.lookup(np.array([0, 5])).tolist() == [-1, -1]
    assert empty.where(0) is None


def test_the_turn_column_is_zero_unless_given_and_optional_on_read(tmp_path):
    assert table().to_pydict()["turn"] == [0, 0, 0]
    given = build_examples_table(columns(turn=[2, 4, 0]), ["a.jsonl", "b.jsonl"], ["c", "d"])
    assert given.to_pydict()["turn"] == [2, 4, 0]
    path = tmp_path / EXAMPLES_NAME
    write_examples(path, given, DATASET)
    assert ExamplesIndex.from_table(read_examples(path, DATASET)).turns.tolist() == [2, 4, 0]
    write_examples(path, given.drop(["turn"]), DATASET)  # as packs made before the column
    older = read_examples(path, DATASET)
    assert "turn" not in older.column_names
    assert ExamplesIndex.from_table(older).turns is None
    with pytest.raises(FormatError, match="turn"):  # asked for by name, it must be there
        read_examples(path, DATASET, ["example_id", "turn"])
