"""One row per example (``input_ids``, ``attention_mask``, ``labels``) for per-example trainers.

Axolotl reads pre-tokenized Parquet whose columns are exactly these three (it packs again
itself with ``sample_packing``); LitGPT and plain Hugging Face ``Trainer`` setups take the same
rows.  Every segment of every packed row becomes its own row, tokens and labels unchanged::

    packed row   a b c | d e        labels  - b c | - e        cu_seqlens [0, 3, 5]
    rows         a b c              labels  - b c              attention_mask 1 1 1
                 d e                        - e                               1 1

The (context → target) pairs stay packshard's exactly; the packing itself is lost.  Files:
``train-00000-of-0000K.parquet``, one per shard, examples in the shard's order.

A pack with preference pairs or KTO records adds, per example, the columns of its
``examples.parquet`` (:data:`PAIR_SCHEMA`): ``example_id``, ``pair_id`` (the chosen branch's
``example_id``), ``branch`` (``chosen`` / ``rejected``) and ``kto_label`` (null where they do
not apply).  A pair's two rows stay adjacent, chosen first, as in the packed row::

    input_ids         example_id  pair_id  branch    kto_label
    <prompt+good>     388         388      chosen    null
    <prompt+bad>      389         388      rejected  null
    <prompt+answer>   17          null     null      true
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packshard.arrays import exclusive_cumsum
from packshard.export.common import Rows, read_rows

SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("attention_mask", pa.list_(pa.int8())),
        ("labels", pa.list_(pa.int32())),
    ]
)
PAIR_SCHEMA = pa.schema(
    [
        ("example_id", pa.int64()),
        ("pair_id", pa.int64()),
        ("branch", pa.string()),
        ("kto_label", pa.bool_()),
    ]
)
"""The per-example columns a pack with pairs or KTO records adds (as in ``examples.parquet``)."""


def pair_columns(rows: Rows) -> list[pa.Array]:
    """Return :data:`PAIR_SCHEMA`'s columns for a shard's segments (``rows.branch`` is set)."""
    assert rows.branch is not None and rows.kto_label is not None
    ids = rows.example_ids.astype(np.int64)
    branch, kto = rows.branch, rows.kto_label
    pair_id = np.where(branch == 2, ids - 1, ids)
    names = np.array([None, "chosen", "rejected"], dtype=object)[branch]
    return [
        pa.array(ids),
        pa.array(pair_id, mask=branch == 0),
        pa.array(names, type=pa.string()),
        pa.array(kto == 1, mask=kto < 0),
    ]


def unpacked_table(rows: Rows) -> pa.Table:
    """Return one row per segment of a shard's rows (and its pair columns in a pair pack)."""
    offsets = pa.array(exclusive_cumsum(rows.seg_len).astype(np.int32))
    columns = [
        pa.ListArray.from_arrays(offsets, pa.array(rows.ids.astype(np.int32, copy=False))),
        pa.ListArray.from_arrays(offsets, pa.array(np.ones(len(rows.ids), dtype=np.int8))),
        pa.ListArray.from_arrays(offsets, pa.array(rows.labels.astype(np.int32, copy=False))),
    ]
    if rows.branch is None:
        return pa.Table.from_arrays(columns, schema=SCHEMA)
    schema = pa.schema([*SCHEMA, *PAIR_SCHEMA])
    return pa.Table.from_arrays([*columns, *pair_columns(rows)], schema=schema)


def write_unpacked(out: Path, folder: Path) -> dict[str, Any]:
    """Write ``out``'s examples one per row into ``folder``; return what was written."""
    tables = [unpacked_table(rows) for rows in read_rows(out)]
    names = [f"train-{k:05d}-of-{len(tables):05d}.parquet" for k in range(len(tables))]
    for name, table in zip(names, tables, strict=True):
        pq.write_table(table, folder / name)
    written: dict[str, Any] = {"files": names, "examples": sum(t.num_rows for t in tables)}
    if tables and "branch" in tables[0].column_names:
        written["pair_columns"] = PAIR_SCHEMA.names
    return written
