"""What every exporter shares: checked reading of the packed rows, atomic output folders.

:func:`read_rows` yields the rows of an output folder one shard at a time as flat numpy arrays
(:class:`Rows`), each shard checked first: its SHA-256 against the manifest, its packshard
metadata against the manifest's dataset id, and the seam invariants every exported layout
relies on (the first label of every segment is -100; every other label is -100 or its own
token)::

    ids       t t t t t t t | t t t t t …    row r = ids[tok_off[r]:tok_off[r + 1]]
    seg_len   3 4 | 5 …                       row r's segments: seg_len[seg_off[r]:seg_off[r + 1]]

An export is written into ``.DIR.partial-PID`` beside ``DIR`` and renamed into place when
complete, like ``pack``; ``export.json`` (the source dataset, the target, every file's SHA-256)
is written last.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packshard.arrays import exclusive_cumsum
from packshard.digests import sha256_path
from packshard.errors import FormatError, UsageError
from packshard.format.manifest import load_manifest
from packshard.format.shards import list_values, read_shard, seq_lengths_column
from packshard.records import IGNORE_INDEX

EXPORT_INFO = "export.json"
COLUMNS = ["input_ids", "labels", "cu_seqlens", "example_ids"]


@dataclass(frozen=True)
class Rows:
    """The rows of one shard: flat token arrays, segment lengths, per-row offsets."""

    ids: np.ndarray  # int32, all rows end to end
    labels: np.ndarray  # int32
    tok_off: np.ndarray  # int64 [rows + 1]: row r is ids[tok_off[r]:tok_off[r + 1]]
    seg_len: np.ndarray  # int64, every segment in row order
    seg_off: np.ndarray  # int64 [rows + 1]: row r holds segments seg_off[r]:seg_off[r + 1]
    example_ids: np.ndarray  # int64, one per segment

    @property
    def num_rows(self) -> int:
        """The number of rows."""
        return len(self.tok_off) - 1

    def seg_starts(self) -> np.ndarray:
        """Every segment's first token in flat coordinates (segments tile the rows in order)."""
        return exclusive_cumsum(self.seg_len)[:-1]


def read_rows(out: Path) -> Iterator[Rows]:
    """Yield the rows of ``out`` shard by shard, each shard checked (see module doc)."""
    manifest = load_manifest(out, validate=False)
    dataset_id = str(manifest.get("dataset_id", ""))
    for entry in manifest.get("shards", []):
        path = out / str(entry["path"])
        if not path.is_file():
            raise FormatError(
                str(path), "listed in the manifest but missing (run packshard verify)"
            )
        if sha256_path(path) != entry.get("sha256"):
            raise FormatError(str(path), "SHA-256 differs from the manifest (run packshard verify)")
        table = read_shard(path, dataset_id, columns=COLUMNS)
        ids, tok_off = list_values(table["input_ids"])
        labels, _ = list_values(table["labels"])
        example_ids, seg_off = list_values(table["example_ids"])
        seg_len, _ = list_values(seq_lengths_column(table["cu_seqlens"]))
        rows = Rows(ids, labels, tok_off, seg_len.astype(np.int64), seg_off, example_ids)
        _check_seams(rows, path)
        yield rows


def _check_seams(rows: Rows, path: Path) -> None:
    starts = rows.seg_starts()
    trained = rows.labels != IGNORE_INDEX
    if len(starts) and trained[starts].any():
        raise FormatError(str(path), "a segment's first label is not -100 (run packshard verify)")
    if (rows.labels[trained] != rows.ids[trained]).any():
        raise FormatError(str(path), "a label is neither -100 nor its token (run packshard verify)")


@contextmanager
def staged_folder(dest: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a fresh hidden folder; rename it to ``dest`` when the block completes.

    ``dest`` may exist only empty, or with ``overwrite`` (it is replaced once the new folder
    is complete).  On any error the hidden folder is removed and ``dest`` is left as it was.
    """
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())) and not overwrite:
        raise UsageError(f"{dest}: output folder exists and is not empty (use --overwrite)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if dest.exists():
            old = dest.parent / f".{dest.name}.old-{os.getpid()}"
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_export_info(folder: Path, info: dict[str, Any]) -> dict[str, Any]:
    """Write ``export.json`` last: ``info`` plus the SHA-256 of every file in ``folder``."""
    files = {p.name: sha256_path(p) for p in sorted(folder.iterdir()) if p.is_file()}
    record = {**info, "files": files}
    (folder / EXPORT_INFO).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record
