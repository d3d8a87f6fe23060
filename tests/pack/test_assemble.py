"""Shard assembly by hand, the Parquet file contract, and third-party readers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_spill

from packshard.records import IGNORE_INDEX as X
from packshard.format.shards import SHARD_SCHEMA, assemble_rows, read_row, write_shard
from packshard.pack.spill import Spill

LENGTHS = [2, 2, 2, 5, 6, 1, 1, 5, 1, 1]  # example i holds tokens 100*i, 100*i + 1, …


def toy_spill() -> Spill:
    return make_spill([[100 * i + k for k in range(n)] for i, n in enumerate(LENGTHS)])


def assemble(segments: list[list[tuple[int, int, int]]], ids: list[list[int]]) -> pa.Table:
    flat = [s for row in segments for s in row]
    row_offsets = np.concatenate(([0], np.cumsum([len(r) for r in segments]))).astype(np.int64)
    return assemble_rows(
        toy_spill(),
        row_offsets,
        np.array([s[0] for s in flat], dtype=np.int64),
        np.array([s[1] for s in flat], dtype=np.int64),
        np.array([s[2] for s in flat], dtype=np.int64),
        np.array([e for row in ids for e in row], dtype=np.int64),
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
    table = assemble_rows(
        spill,
        np.array([0, 2]),
        np.array([4, 0]),
        np.array([0, 0]),
        np.array([6, 2]),
        np.array([0, 1]),
    )
    row = read_row(table, 0)
    assert row.labels.tolist() == [X, X, X, 403, 404, 405, X, 1]
    assert table["num_loss_tokens"].to_pylist() == [4]


def test_assemble_no_rows():
    empty = np.zeros(0, dtype=np.int64)
    table = assemble_rows(toy_spill(), np.zeros(1, np.int64), empty, empty, empty, empty)
    assert table.num_rows == 0 and table.schema == SHARD_SCHEMA


@pytest.mark.parametrize("compression", ["zstd", "snappy", "none"])
def test_write_shard_file_contract(tmp_path, compression):
    table = assemble([[(7, 0, 5), (2, 0, 2)], [(4, 0, 6)]], [[0, 1], [2]])
    info = write_shard(table, tmp_path, "shard-00000.parquet", "ab12" * 8, compression)
    path = tmp_path / "shard-00000.parquet"
    assert (info.path, info.rows, info.tokens, info.loss_tokens) == (
        "shard-00000.parquet",
        2,
        13,
        10,
    )
    assert info.bytes == path.stat().st_size
    import hashlib

    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    meta = pq.read_schema(path).metadata
    assert meta == {b"packshard.format_version": b"1", b"packshard.dataset_id": b"ab12" * 8}
    parquet = pq.ParquetFile(path)
    column = parquet.metadata.row_group(0).column(0)
    assert column.compression == {"none": "UNCOMPRESSED"}.get(compression, compression.upper())
    assert "PLAIN_DICTIONARY" not in column.encodings and "RLE_DICTIONARY" not in column.encodings
    back = pq.read_table(path)
    assert back.schema.remove_metadata() == SHARD_SCHEMA
    assert back.to_pydict() == table.to_pydict()


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
    assert table.schema.remove_metadata() == SHARD_SCHEMA
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
    }


def test_write_shard_from_row_groups_equals_one_table(tmp_path, monkeypatch):
    import packshard.format.shards as shards

    monkeypatch.setattr(shards, "ROW_GROUP_ROWS", 2)
    table = assemble([[(7, 0, 5), (2, 0, 2)], [(4, 0, 6)], [(3, 0, 5)]], [[0, 1], [2], [3]])
    whole = write_shard(table, tmp_path, "a.parquet", "00" * 16, "zstd")
    parts = write_shard(
        iter([table.slice(0, 2), table.slice(2)]), tmp_path, "b.parquet", "00" * 16, "zstd"
    )
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert (parts.rows, parts.tokens, parts.loss_tokens) == (3, 18, 14)
    assert parts.sha256 == whole.sha256 and parts.bytes == whole.bytes
    assert pq.ParquetFile(tmp_path / "b.parquet").metadata.num_row_groups == 2
