"""torchtune packed samples: ``tokens``, ``labels``, ``input_pos``, ``seq_lens``, and their loader.

torchtune's ``PackedDataset`` packs in memory when a recipe starts and has no on-disk form, so
the export writes the samples it would build, one per packshard row, padded to
``max_seq_len`` (``-`` = -100, ``p`` = pad id)::

    packshard   input_ids a b c d e   positions 0 1 2 0 1   cu_seqlens [0, 3, 5]   (L = 8)
    tokens      a b c d e p p p
    labels      - b c - e - - -       unshifted, as torchtune 0.6's recipes shift the row
    input_pos   0 1 2 0 1 2 3 4       padding continues the last position (clipped to L-1)
    seq_lens    [3, 2, 3]             the padding is a sequence of its own

``padded_collate_packed`` turns ``seq_lens`` into a block-causal mask.  torchtune's main
branch shifts labels in the dataset instead (``labels="shifted"``); both give packshard's
(context → target) pairs exactly.

Files: ``train-00000-of-0000K.parquet``, one per packshard shard, int32 list columns.
:func:`packed_dataset` is the builder a recipe's config names::

    dataset:
      _component_: packshard.export.torchtune.packed_dataset
      path: DIR
      packed: True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packshard.arrays import exclusive_cumsum
from packshard.errors import UsageError
from packshard.export.common import Rows, read_rows
from packshard.records import IGNORE_INDEX

LABELS = ("unshifted", "shifted")
COLUMNS = ("tokens", "labels", "input_pos", "seq_lens")
SCHEMA = pa.schema([(name, pa.list_(pa.int32())) for name in COLUMNS])


def torchtune_table(rows: Rows, max_seq_len: int, pad_id: int, labels: str) -> pa.Table:
    """Convert one shard's rows into padded torchtune samples."""
    n_rows, width = rows.num_rows, max_seq_len
    lengths = np.diff(rows.tok_off)
    inside = np.arange(width)[None, :] < lengths[:, None]
    positions = np.arange(len(rows.ids)) - np.repeat(rows.seg_starts(), rows.seg_len)
    targets = rows.labels
    if labels == "shifted":  # per row: the target of position t is the token at t + 1
        targets = np.append(rows.labels[1:], IGNORE_INDEX).astype(np.int32)
        targets[rows.tok_off[1:] - 1] = IGNORE_INDEX
    tokens = np.full((n_rows, width), pad_id, dtype=np.int32)
    label_mat = np.full((n_rows, width), IGNORE_INDEX, dtype=np.int32)
    tokens[inside], label_mat[inside] = rows.ids, targets
    last = positions[rows.tok_off[1:] - 1] if len(positions) else np.zeros(n_rows, np.int64)
    after = last[:, None] + 1 + (np.arange(width)[None, :] - lengths[:, None])
    input_pos = np.where(inside, 0, np.minimum(after, width - 1)).astype(np.int32)
    input_pos[inside] = positions
    pad = width - lengths
    seg_counts = np.diff(rows.seg_off) + (pad > 0)
    seq_lens = np.zeros(int(seg_counts.sum()), dtype=np.int32)
    seq_off = exclusive_cumsum(seg_counts)
    is_pad = np.zeros(len(seq_lens), dtype=bool)
    is_pad[(seq_off[1:] - 1)[pad > 0]] = True
    seq_lens[~is_pad], seq_lens[is_pad] = rows.seg_len, pad[pad > 0]
    row_off = pa.array((np.arange(n_rows + 1) * width).astype(np.int32))
    padded = (tokens, label_mat, input_pos)
    columns = [pa.ListArray.from_arrays(row_off, pa.array(m.ravel())) for m in padded]
    columns.append(pa.ListArray.from_arrays(pa.array(seq_off.astype(np.int32)), pa.array(seq_lens)))
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def write_torchtune(
    out: Path, folder: Path, max_seq_len: int, pad_id: int, labels: str = "unshifted"
) -> dict[str, Any]:
    """Write ``out``'s rows as torchtune samples into ``folder``; return what was written."""
    if labels not in LABELS:
        raise UsageError(f"labels {labels!r} is not one of {', '.join(LABELS)}")
    tables = [torchtune_table(rows, max_seq_len, pad_id, labels) for rows in read_rows(out)]
    names = [f"train-{k:05d}-of-{len(tables):05d}.parquet" for k in range(len(tables))]
    for name, table in zip(names, tables, strict=True):
        pq.write_table(table, folder / name)
    rows = sum(t.num_rows for t in tables)
    return {"files": names, "rows": rows, "labels": labels, "pad_id": pad_id}


class PackedSamples:
    """The exported samples as torchtune's ``PackedDataset`` gives them (``torch.long``)."""

    packed = True

    def __init__(self, path: str | Path) -> None:
        files = sorted(Path(path).glob("train-*.parquet"))
        if not files:
            raise UsageError(
                f"{path}: no train-*.parquet (export with: packshard export OUT --to torchtune "
                "-o DIR)"
            )
        self.table = pa.concat_tables(pq.read_table(f) for f in files).combine_chunks()

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        return {
            name: torch.tensor(self.table[name][index].values.to_numpy(), dtype=torch.long)
            for name in SCHEMA.names
        }


def packed_dataset(
    tokenizer: Any = None, *, path: str, packed: bool = True, **options: Any
) -> PackedSamples:
    """Return the exported samples; the builder a torchtune config's ``dataset`` names.

    The recipe passes its tokenizer and every key of the config; ``packed`` must be true (the
    recipe then collates with ``padded_collate_packed``).
    """
    if not packed:
        raise UsageError("the exported rows are packed: set packed: True in the dataset config")
    if options:
        raise UsageError(f"packed_dataset got options it does not know: {', '.join(options)}")
    return PackedSamples(path)
