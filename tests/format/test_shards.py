"""Shard files: the Parquet contract, row-group writing, checked reading, third-party readers."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packshard.errors import FormatError
from packshard.format.shards import (
    SHARD_PATTERN,
    SHARD_SCHEMA,
    WRITTEN_SCHEMA,
    read_row,
    read_shard,
    schema_problem,
    seq_lengths_column,
    with_seq_lengths,
    write_shard,
)
from packshard.records import IGNORE_INDEX as X

DATASET = "ab12" * 8


def shard_table(rows: list[list[list[int]]], ids: list[list[int]]) -> pa.Table:
    """A shard table of rows given as segments of tokens (each segment's first label masked)."""
    columns: dict[str, list] = {name: [] for name in SHARD_SCHEMA.names}
    for segments, example_ids in zip(rows, ids, strict=True):
        tokens = [t for seg in segments for t in seg]
        labels = [X if k == 0 else t for seg in segments for k, t in enumerate(seg)]
        columns["input_ids"].append(tokens)
        columns["labels"].append(labels)
        columns["position_ids"].append([k for seg in segments for k in range(len(seg))])
        columns["cu_seqlens"].append(np.cumsum([0, *map(len, segments)]).tolist())
        columns["example_ids"].append(example_ids)
        columns["num_tokens"].append(len(tokens))
        columns["num_loss_tokens"].append(sum(v != X for v in labels))
        columns["max_seqlen"].append(max(map(len, segments)))
    return pa.Table.from_pydict(columns, schema=SHARD_SCHEMA)


def tokens(example: int, n: int) -> list[int]:
    return [100 * example + k for k in range(n)]


def two_rows() -> pa.Table:
    return shard_table([[tokens(7, 5), tokens(2, 2)], [tokens(4, 6)]], [[0, 1], [2]])


@pytest.mark.parametrize("compression", ["zstd", "snappy", "none"])
def test_write_shard_file_contract(tmp_path, compression):
    table = two_rows()
    assert table.to_pydict()["labels"] == [
        [X, 701, 702, 703, 704, X, 201],
        [X, 401, 402, 403, 404, 405],
    ]
    info = write_shard(table, tmp_path, SHARD_PATTERN.format(index=0), DATASET, compression)
    path = tmp_path / "shard-00000.parquet"
    assert (info.path, info.rows, info.tokens, info.loss_tokens) == (
        "shard-00000.parquet",
        2,
        13,
        10,
    )
    assert info.bytes == path.stat().st_size
    assert info.to_dict() == {
        "path": "shard-00000.parquet",
        "rows": 2,
        "tokens": 13,
        "loss_tokens": 10,
        "bytes": info.bytes,
        "sha256": info.sha256,
    }
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    meta = pq.read_schema(path).metadata
    assert meta == {b"packshard.format_version": b"1", b"packshard.dataset_id": DATASET.encode()}
    parquet = pq.ParquetFile(path)
    column = parquet.metadata.row_group(0).column(0)
    assert column.compression == {"none": "UNCOMPRESSED"}.get(compression, compression.upper())
    assert "PLAIN_DICTIONARY" not in column.encodings and "RLE_DICTIONARY" not in column.encodings
    back = pq.read_table(path)
    assert back.schema.remove_metadata() == WRITTEN_SCHEMA
    written = table.to_pydict() | {"seq_lengths": [[5, 2], [6]]}  # derived from cu_seqlens
    assert back.to_pydict() == written
    assert read_shard(path, DATASET).to_pydict() == written
    row = read_row(back, 1)
    assert (row.num_tokens, row.num_segments, row.example_ids.tolist()) == (6, 1, [2])


def test_pack_output_reads_with_pyarrow_and_datasets(
    tmp_path, make_jsonl, demo_tokenizer, run_pack
):
    from packshard.demo import demo_data_path

    packed = run_pack(
        [demo_data_path()], demo_tokenizer, template="chatml", max_seq_len=256, shard_rows=5
    )
    assert len(packed.manifest["shards"]) >= 3
    files = [str(packed.out / s["path"]) for s in packed.manifest["shards"]]
    table = pq.read_table(files[0])
    assert table.schema.remove_metadata() == WRITTEN_SCHEMA
    assert table.schema.metadata[b"packshard.dataset_id"] == packed.manifest["dataset_id"].encode()
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(
        "parquet", data_files=files, split="train", cache_dir=str(tmp_path / "hf")
    )
    assert ds.num_rows == packed.manifest["stats"]["rows"]
    assert {k: str(v) for k, v in ds.features.items()} == {
        "input_ids": "List(Value('int32'))",
        "labels": "List(Value('int32'))",
        "position_ids": "List(Value('int32'))",
        "cu_seqlens": "List(Value('int32'))",
        "example_ids": "List(Value('int64'))",
        "num_tokens": "Value('int32')",
        "num_loss_tokens": "Value('int32')",
        "max_seqlen": "Value('int32')",
        "seq_lengths": "List(Value('int32'))",
    }
    for k, row in enumerate(packed.rows):
        assert ds[k]["input_ids"] == row.input_ids.tolist()
        assert ds[k]["labels"] == row.labels.tolist()
        assert ds[k]["cu_seqlens"] == row.cu_seqlens.tolist()
    # examples.parquet column types, as the contract names them
    examples = pq.read_schema(packed.out / "examples.parquet")
    assert {name: str(examples.field(name).type) for name in examples.names} == {
        "example_id": "int64",
        "source": "string",
        "line": "int64",
        "part": "int32",
        "token_offset": "int64",
        "domain": "string",
        "num_tokens": "int32",
        "num_loss_tokens": "int32",
        "truncated": "bool",
        "shard": "int32",
        "row": "int32",
        "turn": "int32",
    }


def test_write_shard_from_row_groups_equals_one_table(tmp_path, monkeypatch):
    import packshard.format.shards as shards

    monkeypatch.setattr(shards, "ROW_GROUP_ROWS", 2)
    rows = [[tokens(7, 5), tokens(2, 2)], [tokens(4, 6)], [tokens(3, 5)]]
    table = shard_table(rows, [[0, 1], [2], [3]])
    whole = write_shard(table, tmp_path, "a.parquet", "00" * 16, "zstd")
    parts = write_shard(
        iter([table.slice(0, 2), table.slice(2)]), tmp_path, "b.parquet", "00" * 16, "zstd"
    )
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert (parts.rows, parts.tokens, parts.loss_tokens) == (3, 18, 14)
    assert parts.sha256 == whole.sha256 and parts.bytes == whole.bytes
    assert pq.ParquetFile(tmp_path / "b.parquet").metadata.num_row_groups == 2


# --- read_shard: refuses files of another dataset or another contract --------------------------


def written(tmp_path, table: pa.Table | None = None, meta: dict | None = None):
    path = tmp_path / "shard-00000.parquet"
    table = two_rows() if table is None else table
    pq.write_table(table.replace_schema_metadata(meta), path)
    return path


def test_read_shard_refuses_another_datasets_file(tmp_path):
    path = write_shard(two_rows(), tmp_path, "shard-00000.parquet", DATASET, "zstd").path
    with pytest.raises(FormatError) as info:
        read_shard(tmp_path / path, "cd34" * 8)
    assert info.value.path == str(tmp_path / path)
    assert info.value.problem == (
        f"packshard.dataset_id {DATASET} differs from the manifest's {'cd34' * 8} (the file "
        "belongs to another pack, or the folder was replaced while it was open)"
    )
    assert str(info.value) == f"{tmp_path / path}: {info.value.problem}"


@pytest.mark.parametrize(
    ("meta", "problem"),
    [
        (None, "no packshard.format_version in its Parquet metadata"),
        (
            {b"packshard.format_version": b"2", b"packshard.dataset_id": DATASET.encode()},
            "packshard.format_version '2' is not supported",
        ),
        (
            {b"packshard.format_version": b"1"},
            f"packshard.dataset_id none differs from the manifest's {DATASET}",
        ),
    ],
    ids=["no-metadata", "newer-version", "no-dataset-id"],
)
def test_read_shard_checks_the_metadata(tmp_path, meta, problem):
    with pytest.raises(FormatError) as info:
        read_shard(written(tmp_path, meta=meta), DATASET)
    assert info.value.problem.startswith(problem)


def test_read_shard_checks_the_columns(tmp_path):
    meta = {b"packshard.format_version": b"1", b"packshard.dataset_id": DATASET.encode()}
    wrong = two_rows().drop_columns(["max_seqlen"])
    with pytest.raises(FormatError) as info:
        read_shard(written(tmp_path, wrong, meta), DATASET)
    assert info.value.problem == "missing columns max_seqlen (not a format version 1 shard)"
    # asking for some columns reads just those (their schema is not checked)
    path = written(tmp_path, wrong, meta)
    assert read_shard(path, DATASET, columns=["num_tokens"]).column_names == ["num_tokens"]


def test_read_shard_refuses_a_file_that_is_not_parquet(tmp_path):
    path = tmp_path / "shard-00000.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(FormatError) as info:
        read_shard(path, DATASET)
    assert info.value.problem.startswith("unreadable Parquet: ")


def test_schema_problem_names_the_first_difference():
    assert schema_problem(SHARD_SCHEMA) is None
    assert schema_problem(SHARD_SCHEMA.with_metadata({b"k": b"v"})) is None
    missing = pa.schema([f for f in SHARD_SCHEMA if f.name not in ("labels", "cu_seqlens")])
    assert schema_problem(missing) == (
        "missing columns labels, cu_seqlens (not a format version 1 shard)"
    )
    retyped = SHARD_SCHEMA.set(0, pa.field("input_ids", pa.list_(pa.int64())))
    assert schema_problem(retyped) == (
        "column input_ids is list<item: int64>, the contract says list<item: int32>"
    )
    # an optional column is checked only when present; unknown columns are ignored
    assert schema_problem(WRITTEN_SCHEMA.append(pa.field("extra", pa.string()))) is None
    wrong_optional = WRITTEN_SCHEMA.set(8, pa.field("seq_lengths", pa.list_(pa.int64())))
    assert schema_problem(wrong_optional) == (
        "column seq_lengths is list<item: int64>, the contract says list<item: int32>"
    )


def test_seq_lengths_are_derived_from_cu_seqlens_and_replace_any_given():
    segments = [[tokens(1, 3), tokens(2, 1), tokens(3, 4)], [tokens(4, 2)]]
    table = shard_table(segments, [[0, 1, 2], [3]])
    assert seq_lengths_column(table["cu_seqlens"]).to_pylist() == [[3, 1, 4], [2]]
    stale = table.append_column("seq_lengths", pa.array([[9], [9, 9]], pa.list_(pa.int32())))
    fixed = with_seq_lengths(stale)
    assert fixed.schema == WRITTEN_SCHEMA
    assert fixed["seq_lengths"].to_pylist() == [[3, 1, 4], [2]]
    chunked = pa.concat_tables([table.slice(1), table.slice(0, 1)])  # offsets not at 0, 2 chunks
    assert seq_lengths_column(chunked["cu_seqlens"]).to_pylist() == [[2], [3, 1, 4]]
