"""One row per example (``input_ids``, ``attention_mask``, ``labels``) for per-example trainers.

Axolotl reads pre-tokenized Parquet whose columns are exactly these three (it packs again
itself with ``sample_packing``); LitGPT and plain Hugging Face ``Trainer`` setups take the same
rows.  Every segment of every packed row becomes its own row, tokens and labels unchanged::

    packed row   a b c | d e        labels  - b c | - e        cu_seqlens [0, 3, 5]
    rows         a b c              labels  - b c              attention_mask 1 1 1
                 d e                        - e                               1 1

The (context → target) pairs stay packshard's exactly; what is lost is the packing itself: which
examples share a row, the row order, the per-row token budget (a trainer that packs again makes
its own rows, steps and loss normalisation).  Files: ``train-00000-of-0000K.parquet``, one per
packshard shard, examples in the shard's order; the lists are slices of the shard's own
buffers (no per-example copy).
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


def unpacked_table(rows: Rows) -> pa.Table:
    """Return one row per segment of a shard's rows."""
    offsets = pa.array(exclusive_cumsum(rows.seg_len).astype(np.int32))
    columns = [
        pa.ListArray.from_arrays(offsets, pa.array(rows.ids.astype(np.int32, copy=False))),
        pa.ListArray.from_arrays(offsets, pa.array(np.ones(len(rows.ids), dtype=np.int8))),
        pa.ListArray.from_arrays(offsets, pa.array(rows.labels.astype(np.int32, copy=False))),
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def write_unpacked(out: Path, folder: Path) -> dict[str, Any]:
    """Write ``out``'s examples one per row into ``folder``; return what was written."""
    tables = [unpacked_table(rows) for rows in read_rows(out)]
    names = [f"train-{k:05d}-of-{len(tables):05d}.parquet" for k in range(len(tables))]
    for name, table in zip(names, tables, strict=True):
        pq.write_table(table, folder / name)
    return {"files": names, "examples": sum(t.num_rows for t in tables)}
