"""Assemble packed rows from the spill and write them as Parquet shards.

A plan names, for every segment, the spilled example it comes from and the token range within
it.  Assembly gathers each segment's range from the spill (a jitted copy per segment) and
builds the columns with vectorised numpy, no per-token Python::

    segments   [ex7 0:5] [ex2 0:2] [ex9 0:1] | [ex4 0:6] [ex1 0:2]
    row          0                            | 1
    input_ids    a a a a a b b c              | d d d d d d e e
    labels       - a a a a - b -              | - d d d d d - e      ('-' = IGNORE_INDEX)
    position_ids 0 1 2 3 4 0 1 0              | 0 1 2 3 4 5 0 1
    cu_seqlens   [0, 5, 7, 8]                 | [0, 6, 8]

The first label of every segment is masked (no target crosses a seam), positions restart at
0 in every segment (policy ``reset``), and ``cu_seqlens`` records every boundary.  Integer list
columns are written without dictionary encoding (smaller and faster for token ids), zstd by
default; each file's key-value metadata carries the format version and dataset id.  A shard is
assembled and written one row group (``ROW_GROUP_ROWS`` rows) at a time, so memory holds two
row groups' columns (one being written while the next is assembled), about 45 bytes a token
each (≈48 MB at 256 rows × 4,096 tokens), whatever the shard size.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packshard.format.manifest import FORMAT_VERSION, META_DATASET_ID, META_FORMAT_VERSION, sha256_path
from packshard.records import IGNORE_INDEX, PackedRow
from packshard.pack.spill import Spill

SHARD_COLUMNS = (
    "input_ids",
    "labels",
    "position_ids",
    "cu_seqlens",
    "example_ids",
    "num_tokens",
    "num_loss_tokens",
    "max_seqlen",
)
SHARD_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
        ("position_ids", pa.list_(pa.int32())),
        ("cu_seqlens", pa.list_(pa.int32())),
        ("example_ids", pa.list_(pa.int64())),
        ("num_tokens", pa.int32()),
        ("num_loss_tokens", pa.int32()),
        ("max_seqlen", pa.int32()),
    ]
)
ROW_GROUP_ROWS = 256


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """What the manifest records about one written shard."""

    path: str
    rows: int
    tokens: int
    loss_tokens: int
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, object]:
        """Return the manifest entry."""
        return {
            "path": self.path,
            "rows": self.rows,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "bytes": self.bytes,
            "sha256": self.sha256,
        }


def exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    """Return ``[0, v0, v0+v1, …]`` (length ``len(values) + 1``, int64)."""
    out = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=out[1:])
    return out


def assemble_rows(
    spill: Spill,
    row_offsets: np.ndarray,
    seg_example: np.ndarray,
    seg_start: np.ndarray,
    seg_length: np.ndarray,
    example_ids: np.ndarray,
) -> pa.Table:
    """Build the shard table for a block of rows by gathering tokens from the spill.

    ``row_offsets`` is local to the block (starts at 0); the segment arrays are the block's.
    """
    seg_len = seg_length.astype(np.int64)
    nrows = len(row_offsets) - 1
    out_start = exclusive_cumsum(seg_len)
    total = int(out_start[-1])
    input_ids, labels = spill.read_ranges(spill.offsets[seg_example] + seg_start, seg_len)
    labels[out_start[:-1][seg_len > 0]] = IGNORE_INDEX
    position_ids = (np.arange(total, dtype=np.int64) - np.repeat(out_start[:-1], seg_len)).astype(
        np.int32
    )
    segs_per_row = np.diff(row_offsets)
    row_tok = exclusive_cumsum(np.add.reduceat(seg_len, row_offsets[:-1]) if nrows else seg_len)
    seg_end_in_row = out_start[1:] - np.repeat(row_tok[:-1], segs_per_row)
    cu_offsets = row_offsets + np.arange(nrows + 1)
    cu_values = np.zeros(len(seg_len) + nrows, dtype=np.int32)
    is_end = np.ones(len(cu_values), dtype=bool)
    is_end[cu_offsets[:-1]] = False
    cu_values[is_end] = seg_end_in_row
    is_loss = (labels != IGNORE_INDEX).astype(np.int64)
    loss_csum = exclusive_cumsum(is_loss)
    num_loss = loss_csum[row_tok[1:]] - loss_csum[row_tok[:-1]]
    max_seqlen = np.maximum.reduceat(seg_len, row_offsets[:-1]) if nrows else seg_len
    tok_off = pa.array(row_tok.astype(np.int32))
    columns = [
        pa.ListArray.from_arrays(tok_off, pa.array(input_ids)),
        pa.ListArray.from_arrays(tok_off, pa.array(labels)),
        pa.ListArray.from_arrays(tok_off, pa.array(position_ids)),
        pa.ListArray.from_arrays(pa.array(cu_offsets.astype(np.int32)), pa.array(cu_values)),
        pa.ListArray.from_arrays(
            pa.array(row_offsets.astype(np.int32)), pa.array(example_ids.astype(np.int64))
        ),
        pa.array(np.diff(row_tok).astype(np.int32)),
        pa.array(num_loss.astype(np.int32)),
        pa.array(max_seqlen.astype(np.int32)),
    ]
    return pa.Table.from_arrays(columns, schema=SHARD_SCHEMA)


def write_shard(
    tables: pa.Table | Iterable[pa.Table],
    folder: Path,
    name: str,
    dataset_id: str,
    compression: str,
) -> ShardInfo:
    """Write one shard file from a table, or from row-group tables made one at a time.

    Given an iterable, each table is written as soon as it is made, so a shard of many rows
    never sits in memory whole; blocks of ``ROW_GROUP_ROWS`` rows give the same file as one
    table.  Returns the shard's manifest entry.
    """
    meta = {META_FORMAT_VERSION: str(FORMAT_VERSION).encode(), META_DATASET_ID: dataset_id.encode()}
    path = folder / name
    rows = tokens = loss_tokens = 0
    with (
        pq.ParquetWriter(
            path,
            SHARD_SCHEMA.with_metadata(meta),
            compression=None if compression == "none" else compression,
            use_dictionary=False,
            write_statistics=["num_tokens", "num_loss_tokens", "max_seqlen"],
        ) as writer,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="packshard-write") as pool,
    ):
        # Encoding and compressing a row group releases the GIL: it runs on the pool while
        # this thread assembles the next one.
        writing: Future[None] | None = None
        for table in [tables] if isinstance(tables, pa.Table) else tables:
            if writing is not None:
                writing.result()
            group = table.replace_schema_metadata(meta)
            writing = pool.submit(writer.write_table, group, row_group_size=ROW_GROUP_ROWS)
            rows += table.num_rows
            tokens += int(pa.compute.sum(table["num_tokens"]).as_py() or 0)
            loss_tokens += int(pa.compute.sum(table["num_loss_tokens"]).as_py() or 0)
        if writing is not None:
            writing.result()
    return ShardInfo(
        path=name,
        rows=rows,
        tokens=tokens,
        loss_tokens=loss_tokens,
        bytes=path.stat().st_size,
        sha256=sha256_path(path),
    )


def list_values(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Return a list column's flat values and int64 offsets (zero-copy where possible)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)
    base = int(offsets[0])
    return values[base : int(offsets[-1])], offsets - base


def read_row(table: pa.Table, index: int) -> PackedRow:
    """Return row ``index`` of a shard table as a :class:`PackedRow`."""

    def cell(name: str, dtype: type) -> np.ndarray:
        return np.asarray(table[name][index].values.to_numpy(zero_copy_only=False), dtype=dtype)

    return PackedRow(
        input_ids=cell("input_ids", np.int32),
        labels=cell("labels", np.int32),
        position_ids=cell("position_ids", np.int32),
        cu_seqlens=cell("cu_seqlens", np.int32),
        example_ids=cell("example_ids", np.int64),
    )
