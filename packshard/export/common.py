"""What every exporter shares: checked reading of the packed rows, atomic output folders.

:func:`read_rows` yields the rows of an output folder one shard at a time as flat numpy arrays
(:class:`Rows`), each shard checked first, as the torch reader checks it: read once, its
SHA-256 computed as it is read and compared with the manifest's (those bytes are what is
decoded), its packshard metadata against the manifest's dataset id, its token ids inside the
manifest's ``vocab_size``, and the seam invariants every exported layout relies on (the first
label of every segment is -100; every other label is -100 or its own token)::

    ids       t t t t t t t | t t t t t …    row r = ids[tok_off[r]:tok_off[r + 1]]
    seg_len   3 4 | 5 …                       row r's segments: seg_len[seg_off[r]:seg_off[r + 1]]

An export's folder is claimed like ``pack``'s (:mod:`packshard.format.folder.claim`);
``export.json`` is written last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packshard.arrays import exclusive_cumsum
from packshard.digests import read_hashed, sha256_path
from packshard.errors import FormatError, ManifestError
from packshard.format.folder.outdir import EXPORT_INFO
from packshard.format.folder.paths import duplicate_paths, open_inside
from packshard.format.manifest import load_manifest, load_schema
from packshard.format.shards import (
    list_values,
    read_shard,
    read_shard_groups,
    replaced_shard,
    rows_problem,
    seq_lengths_column,
    tokens_problem,
)
from packshard.records import IGNORE_INDEX

COLUMNS = ["input_ids", "labels", "cu_seqlens", "example_ids"]
PREFERENCE_TARGETS = ("unpacked", "mds")
"""The targets that carry a pair pack's ``branch`` and ``kto_label`` (others refuse it)."""


@dataclass(frozen=True)
class Rows:
    """The rows of one shard: flat token arrays, segment lengths, per-row offsets."""

    ids: np.ndarray  # int32, all rows end to end
    labels: np.ndarray  # int32
    tok_off: np.ndarray  # int64 [rows + 1]: row r is ids[tok_off[r]:tok_off[r + 1]]
    seg_len: np.ndarray  # int64, every segment in row order
    seg_off: np.ndarray  # int64 [rows + 1]: row r holds segments seg_off[r]:seg_off[r + 1]
    example_ids: np.ndarray  # int64, one per segment
    branch: np.ndarray | None = None  # int8 per segment (0, 1 chosen, 2 rejected) in pair packs
    kto_label: np.ndarray | None = None  # int8 per segment (-1 none, 0, 1) in pair packs

    @property
    def num_rows(self) -> int:
        """The number of rows."""
        return len(self.tok_off) - 1

    def seg_starts(self) -> np.ndarray:
        """Every segment's first token in flat coordinates (segments tile the rows in order)."""
        return exclusive_cumsum(self.seg_len)[:-1]


def load_source(out: Path) -> dict[str, Any]:
    """Load ``out``'s manifest, checking every value an export uses against the schema.

    The dataset id, every shard entry, ``config.max_seq_len`` and the ``tokenizer`` entry; a
    violation is one line (:class:`~packshard.errors.ManifestError`).
    """
    import jsonschema

    manifest = load_manifest(out, validate=False)
    repeated = duplicate_paths(manifest)
    if repeated is not None:
        raise ManifestError(repeated)
    full = load_schema()
    props = full["properties"]

    def only(key: str, field: str) -> dict[str, Any]:
        return {"type": "object", "properties": {field: props[key]["properties"][field]}}

    schema = {
        "type": "object",
        "required": ["dataset_id", "shards", "config", "tokenizer"],
        "properties": {
            "dataset_id": props["dataset_id"],
            "shards": props["shards"],
            "config": only("config", "max_seq_len") | {"required": ["max_seq_len"]},
            "tokenizer": props["tokenizer"],
        },
        "$defs": full["$defs"],
    }
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(manifest),
        key=lambda e: list(e.absolute_path),
    )
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(root)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ManifestError(f"manifest.json: {where}: {errors[0].message}{more}")
    return manifest


def preference_refusal(manifest: dict[str, Any], target: str) -> str | None:
    """Return why ``target`` cannot take this pack's pairs or KTO records, or None.

    A pack holds them when its manifest counts packed pairs or KTO labels.  Megatron's and
    torchtune's packed SFT layouts would train every branch as an answer; ``unpacked`` and
    ``mds`` carry ``branch`` and ``kto_label``.
    """
    stats = manifest.get("stats") or {}
    pairs = (stats.get("pairs") or {}).get("packed", 0)
    kto = stats.get("kto") or {}
    if target in PREFERENCE_TARGETS or not (pairs or any(kto.values())):
        return None
    held = f"{pairs} preference pairs" if pairs else "KTO records"
    return (
        f"this pack holds {held}; --to {target} feeds an SFT recipe that would train every "
        "branch as a plain answer and has no column for branch or kto_label (export --to "
        "unpacked or mds, which carry them, or train with packshard.torch.pairs: see "
        "docs/preference-training.md)"
    )


def read_rows(
    out: Path,
    splits: tuple[str, ...] = ("train",),
    columns: list[str] | None = None,
    by_group: bool = False,
) -> Iterator[Rows]:
    """Yield the rows of ``out`` shard by shard, each shard checked (see module doc).

    Only the shards of ``splits`` are read (by default the train shards); ``columns`` (at least
    :data:`COLUMNS`) reads only those; ``by_group`` yields each row group, checked alike.
    """
    manifest = load_source(out)
    dataset_id = str(manifest["dataset_id"])
    vocab_size = int(manifest["tokenizer"]["vocab_size"])
    for entry in manifest["shards"]:
        if entry.get("split", "train") not in splits:
            continue
        path = out / str(entry["path"])
        try:
            fd = open_inside(out, entry["path"])
        except FormatError as exc:
            raise FormatError(str(path), exc.problem) from None
        with os.fdopen(fd, "rb") as fh:
            raw, digest = read_hashed(fh)  # the bytes hashed are the bytes decoded
        if digest != entry["sha256"]:
            raise FormatError(str(path), replaced_shard(out))
        if by_group:
            for group, table in enumerate(read_shard_groups(path, dataset_id, columns, raw)):
                yield _checked_rows(table, vocab_size, path, f"row group {group}: ")
        else:
            table = read_shard(path, dataset_id, columns, data=raw)  # without columns: all
            yield _checked_rows(table, vocab_size, path)
        del raw


def _checked_rows(table: pa.Table, vocab_size: int, path: Path, where: str = "") -> Rows:
    """Return a shard's (or row group's) rows, their boundaries, tokens and seams checked."""
    problem = rows_problem(table) or tokens_problem(table, vocab_size)
    if problem is not None:
        raise FormatError(str(path), f"{where}{problem} (run packshard verify)")
    ids, tok_off = list_values(table["input_ids"])
    labels, _ = list_values(table["labels"])
    example_ids, seg_off = list_values(table["example_ids"])
    seg_len, _ = list_values(seq_lengths_column(table["cu_seqlens"]))
    branch = kto = None
    if "branch" in table.column_names and "kto_label" in table.column_names:
        branch = list_values(table["branch"])[0].astype(np.int8)
        kto = list_values(table["kto_label"])[0].astype(np.int8)
    rows = Rows(ids, labels, tok_off, seg_len.astype(np.int64), seg_off, example_ids, branch, kto)
    _check_seams(rows, path)
    return rows


def _check_seams(rows: Rows, path: Path) -> None:
    starts = rows.seg_starts()
    if len(starts) and (rows.labels[starts] != IGNORE_INDEX).any():
        raise FormatError(str(path), "a segment's first label is not -100 (run packshard verify)")


def write_export_info(folder: Path, info: dict[str, Any]) -> dict[str, Any]:
    """Write ``export.json`` last: ``info`` plus the SHA-256 of every file in ``folder``."""
    files = {p.name: sha256_path(p) for p in sorted(folder.iterdir()) if p.is_file()}
    record = {**info, "files": files}
    (folder / EXPORT_INFO).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record
