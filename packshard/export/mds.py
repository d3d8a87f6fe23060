"""MosaicML streaming's MDS: one sample per packed row, written without the library.

An MDS folder is ``index.json`` and shard files ``shard.00000.mds …``.  A shard file is::

    uint32 samples | uint32 offsets[samples + 1] (from the file start) | config JSON | samples

and a sample is the ``uint32`` byte size of every variable-size column, then every column's
bytes, columns in name order.  ``ndarray:int32`` (a static dtype, dynamic shape) is stored as
one byte ``ndim << 2 | shape type`` (0/1/2 = uint8/16/32), the shape in that type, then the
values; ``int32`` as its 4 bytes.  A shard is closed before a sample would take it past
``size_limit`` bytes, and each shard's entry in ``index.json`` repeats the config with its
file name, size and sample count.  This is what ``streaming.MDSWriter`` writes without
compression or hashes, and ``streaming.StreamingDataset(local=DIR)`` reads it; the samples
carry the shard columns under the same names, so a reader keeps every seam.

A pack with preference pairs or KTO records adds its per-segment shard columns ``branch``
and ``kto_label`` (``ndarray:int8``, :data:`PAIR_COLUMNS`) to every sample: a row is one
sample, so a pair's two segments stay adjacent in it, chosen first, exactly as packed.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np

from packshard.arrays import count_trained, exclusive_cumsum
from packshard.export.common import Rows, read_rows

SIZE_LIMIT = 1 << 26
COLUMNS = {
    "cu_seqlens": "ndarray:int32",
    "example_ids": "ndarray:int64",
    "input_ids": "ndarray:int32",
    "labels": "ndarray:int32",
    "max_seqlen": "int32",
    "num_loss_tokens": "int32",
    "num_tokens": "int32",
    "position_ids": "ndarray:int32",
    "seq_lengths": "ndarray:int32",
}
"""Column name → MDS encoding, in the name order MDS stores them."""
PAIR_COLUMNS = {"branch": "ndarray:int8", "kto_label": "ndarray:int8"}
"""The columns a pack with pairs or KTO records adds (per segment, as in its shards)."""


def mds_config(size_limit: int, pairs: bool = False) -> dict[str, Any]:
    """Return the writer config every shard file embeds and ``index.json`` repeats."""
    columns = COLUMNS | PAIR_COLUMNS if pairs else COLUMNS
    encodings = [columns[name] for name in sorted(columns)]
    return {
        "column_encodings": encodings,
        "column_names": sorted(columns),
        "column_sizes": [None if e.startswith("ndarray") else 4 for e in encodings],
        "compression": None,
        "format": "mds",
        "hashes": [],
        "size_limit": size_limit,
        "version": 2,
    }


def encode_array(values: np.ndarray) -> bytes:
    """Encode a non-empty 1-D array as MDS ``ndarray:<dtype>`` with a dynamic shape."""
    n = len(values)
    assert n > 0, "MDS cannot encode an empty array"  # every row has a token and a segment
    code, shape_type = (
        (0, np.uint8) if n < 1 << 8 else (1, np.uint16) if n < 1 << 16 else (2, np.uint32)
    )
    return bytes([1 << 2 | code]) + np.array([n], shape_type).tobytes() + values.tobytes()


def row_samples(rows: Rows) -> list[bytes]:
    """Encode every row of a shard as one MDS sample."""
    starts = np.repeat(rows.seg_starts(), rows.seg_len)  # every token's segment start
    positions = (np.arange(len(rows.ids)) - starts).astype(np.int32)
    loss = count_trained(rows.labels, rows.tok_off, skip_first=False).astype(np.int32)
    columns = COLUMNS | PAIR_COLUMNS if rows.branch is not None else COLUMNS
    samples = []
    for r in range(rows.num_rows):
        lo, hi = int(rows.tok_off[r]), int(rows.tok_off[r + 1])
        s_lo, s_hi = int(rows.seg_off[r]), int(rows.seg_off[r + 1])
        lengths = rows.seg_len[s_lo:s_hi].astype(np.int32)
        values = {
            "cu_seqlens": exclusive_cumsum(lengths).astype(np.int32),
            "example_ids": rows.example_ids[s_lo:s_hi].astype(np.int64),
            "input_ids": rows.ids[lo:hi].astype(np.int32),
            "labels": rows.labels[lo:hi].astype(np.int32),
            "max_seqlen": np.int32(lengths.max()),
            "num_loss_tokens": loss[r],
            "num_tokens": np.int32(hi - lo),
            "position_ids": positions[lo:hi],
            "seq_lengths": lengths,
        }
        if rows.branch is not None and rows.kto_label is not None:
            values["branch"] = rows.branch[s_lo:s_hi].astype(np.int8)
            values["kto_label"] = rows.kto_label[s_lo:s_hi].astype(np.int8)
        names = sorted(columns)
        parts = [
            encode_array(values[k]) if columns[k].startswith("ndarray") else values[k].tobytes()
            for k in names
        ]
        sizes = [len(p) for k, p in zip(names, parts, strict=True) if "ndarray" in columns[k]]
        samples.append(np.array(sizes, np.uint32).tobytes() + b"".join(parts))
    return samples


def write_mds(out: Path, folder: Path, size_limit: int = SIZE_LIMIT) -> dict[str, Any]:
    """Write ``out``'s rows as an MDS dataset into ``folder``; return what was written."""
    shard_rows = read_rows(out)
    first = next(shard_rows, None)  # every shard of a pack has the same columns
    config = mds_config(size_limit, pairs=first is not None and first.branch is not None)
    config_bytes = json.dumps(config, sort_keys=True).encode("utf-8")
    shards: list[dict[str, Any]] = []
    pending: list[bytes] = []
    size = 8 + len(config_bytes)

    def flush() -> None:
        lengths = np.array([0] + [len(s) for s in pending], dtype=np.int64)
        offsets = (np.cumsum(lengths) + 4 + 4 * len(lengths) + len(config_bytes)).astype(np.uint32)
        data = (
            np.uint32(len(pending)).tobytes() + offsets.tobytes() + config_bytes + b"".join(pending)
        )
        name = f"shard.{len(shards):05d}.mds"
        (folder / name).write_bytes(data)
        raw = {"basename": name, "bytes": len(data), "hashes": {}}
        shards.append({**config, "raw_data": raw, "samples": len(pending), "zip_data": None})

    for rows in itertools.chain([first] if first is not None else [], shard_rows):
        for sample in row_samples(rows):
            if pending and size + len(sample) + 4 > size_limit:
                flush()
                pending, size = [], 8 + len(config_bytes)
            pending.append(sample)
            size += len(sample) + 4
    if pending or not shards:
        flush()
    index = {"shards": shards, "version": 2}
    (folder / "index.json").write_text(json.dumps(index, sort_keys=True), encoding="utf-8")
    return {"index": "index.json", "shards": len(shards), "rows": sum(s["samples"] for s in shards)}
