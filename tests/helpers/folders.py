"""Hand-made output folders for the reader: rows, shards and manifests written directly."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packshard.records import IGNORE_INDEX, PackedRow

# --- hand-made output folders for the reader ---------------------------------------------------

TOKENIZER_BYTES = b'{"model": "fixture tokenizer"}'
TOKENIZER_SHA = hashlib.sha256(TOKENIZER_BYTES).hexdigest()


def make_row(lengths: list[int], first_example: int, rng: np.random.Generator) -> PackedRow:
    """A contract row: random tokens, prompt half unlabelled, first label of a segment -100."""
    n = sum(lengths)
    ids = rng.integers(5, 1000, size=n, dtype=np.int32)
    labels = ids.copy()
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    positions = np.concatenate([np.arange(k, dtype=np.int32) for k in lengths])
    for lo, k in zip(cu[:-1], lengths, strict=True):
        labels[lo : lo + max(1, k // 2)] = IGNORE_INDEX
    return PackedRow(
        input_ids=ids,
        labels=labels,
        position_ids=positions,
        cu_seqlens=cu,
        example_ids=np.arange(first_example, first_example + len(lengths), dtype=np.int64),
    )


def write_out(
    out: Path,
    shards: list[list[PackedRow]],
    *,
    max_seq_len: int = 64,
    version: int = 1,
    position_policy: str | None = None,
    segment_columns: dict[str, list[list[int]]] | None = None,
    vocab_size: int = 1 << 20,
) -> Path:
    """Write a contract-compliant OUT folder (shards + manifest) from hand-made rows.

    ``segment_columns`` adds per-segment int8 list columns (``branch``, ``kto_label``), one
    list per row over all shards in order.
    """
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    first = 0
    for k, rows in enumerate(shards):
        extra = {
            name: pa.array(values[first : first + len(rows)], type=pa.list_(pa.int8()))
            for name, values in (segment_columns or {}).items()
        }
        first += len(rows)
        cols = {
            name: pa.array(
                [getattr(r, name).tolist() for r in rows],
                type=pa.list_(pa.int64() if name == "example_ids" else pa.int32()),
            )
            for name in ("input_ids", "labels", "position_ids", "cu_seqlens", "example_ids")
        }
        cols["num_tokens"] = pa.array([r.num_tokens for r in rows], pa.int32())
        cols["num_loss_tokens"] = pa.array(
            [int((r.labels != IGNORE_INDEX).sum()) for r in rows], pa.int32()
        )
        cols["max_seqlen"] = pa.array([int(np.diff(r.cu_seqlens).max()) for r in rows], pa.int32())
        cols |= extra
        meta = {
            b"packshard.format_version": str(version).encode(),
            b"packshard.dataset_id": b"f0f0f0f0f0f0f0f0",
        }
        table = pa.table(cols).replace_schema_metadata(meta)
        name = f"shard-{k:05d}.parquet"
        pq.write_table(table, out / name, row_group_size=3, compression="zstd")
        entries.append(
            {
                "path": name,
                "rows": len(rows),
                "tokens": sum(r.num_tokens for r in rows),
                "loss_tokens": int(sum(cols["num_loss_tokens"].to_pylist())),
                "bytes": (out / name).stat().st_size,
                "sha256": hashlib.sha256((out / name).read_bytes()).hexdigest(),
            }
        )
    manifest = {
        "format_version": version,
        "dataset_id": "f0f0f0f0f0f0f0f0",
        "config": {"max_seq_len": max_seq_len}
        | ({"position_ids": position_policy} if position_policy else {}),
        "tokenizer": {
            "path": "tokenizer.json",
            "sha256": TOKENIZER_SHA,
            "vocab_size": vocab_size,
            "bos_token_id": None,
            "eos_token_id": None,
            "pad_token_id": None,
        },
        "shards": entries,
        "stats": {"rows": sum(e["rows"] for e in entries)},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2))
    return out


def fixture_rows(num_rows: int, seed: int = 0) -> list[PackedRow]:
    rng = np.random.default_rng(seed)
    rows, next_id = [], 0
    for _ in range(num_rows):
        lengths = rng.integers(1, 12, size=int(rng.integers(1, 5))).tolist()
        rows.append(make_row(lengths, next_id, rng))
        next_id += len(lengths)
    return rows
