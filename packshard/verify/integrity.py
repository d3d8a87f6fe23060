"""The integrity stage of ``verify``: files, checksums, metadata and the counting rule.

The manifest validates against its schema and format version; every file it names has the
recorded size and SHA-256; every Parquet file carries this dataset's id; a reference sidecar
holds one finite value per scored example (:mod:`packshard.format.sidecars.reference`); the
dataset card names the shards and index; counts agree; and the counting rule holds::

    records = records_packed + rejected + dropped        lines(rejects.jsonl) = rejected + dropped

in total and per domain.  Files the manifest does not name are never read, nor any it names
outside the folder or that is no regular file: each is a finding
(:mod:`packshard.format.folder.paths`); a manifest that breaks its schema opens nothing.  The
counts stage (:func:`check_counts`) runs after the structural audit, whose totals it needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packshard.digests import sha256_path
from packshard.errors import FormatError
from packshard.format.card import card_problem
from packshard.format.examples import ExamplesIndex, read_examples
from packshard.format.folder.paths import MISSING, duplicate_paths, inside_folder
from packshard.format.manifest import schema_errors
from packshard.format.rejects import read_rejects
from packshard.format.shards import read_shard
from packshard.format.sidecars.reference import REFERENCE_KEY, read_reference, scored_example_ids
from packshard.verify.findings import Finding, FindingList
from packshard.verify.structure import ShardAudit

RECORD_BINS = ("records_packed", "rejected", "dropped")
DOMAIN_TOTALS = ("records", *RECORD_BINS, "examples", "tokens", "loss_tokens")


@dataclass(frozen=True)
class OpenedFiles:
    """What the files stage could open, for the later stages."""

    tables: dict[int, pa.Table]  # shard index -> table
    index: ExamplesIndex | None
    schema_valid: bool


def check_files(folder: Path, manifest: dict[str, Any], findings: FindingList) -> OpenedFiles:
    """Check the schema and every named file's size and checksum; open the readable ones."""
    repeated = duplicate_paths(manifest)
    if repeated is not None:  # before the schema: nothing is validated or opened per entry
        findings.add(Finding("integrity", repeated), "duplicate")
        return OpenedFiles({}, None, False)
    problems = schema_errors(manifest)
    for problem in problems:
        findings.add(Finding("integrity", problem), "schema")
    if problems:  # values of the wrong type or size: nothing it names is opened
        return OpenedFiles({}, None, False)
    tables: dict[int, pa.Table] = {}
    dataset_id = str(manifest.get("dataset_id", ""))
    named = [(f"files/{k}", v) for k, v in sorted(manifest.get("files", {}).items())]
    named += [(f"shards/{i}", entry) for i, entry in enumerate(manifest.get("shards", []))]
    index = None
    found: dict[str, Path] = {}
    for key, entry in named:
        path = _named_file(folder, key, entry, findings)
        if path is None:
            continue
        found[key] = path
        try:
            if key.startswith("shards/"):
                tables[int(key.split("/")[1])] = read_shard(path, dataset_id)
            elif key == "files/examples":
                index = ExamplesIndex.from_table(read_examples(path, dataset_id))
        except FormatError as exc:
            findings.add(Finding("integrity", f"{entry['path']}: {exc.problem}"), "unreadable")
        if key == "files/card" and (card := card_problem(folder, manifest)) is not None:
            findings.add(Finding("integrity", f"{entry['path']}: {card}"), "card")
    sidecar = found.get(f"files/{REFERENCE_KEY}")
    if sidecar is not None:
        whole = len(tables) == len(manifest.get("shards", []))
        expected = scored_example_ids(tables.values()) if whole else None
        _check_reference(sidecar, expected, dataset_id, findings)
    return OpenedFiles(tables, index, not problems)


def _check_reference(
    path: Path, expected: np.ndarray | None, dataset_id: str, findings: FindingList
) -> None:
    """Check the reference log-probability sidecar as its trainer-side reader does."""
    try:
        read_reference(path, path.read_bytes(), dataset_id, expected)
    except FormatError as exc:
        findings.add(Finding("integrity", f"{path.name}: {exc.problem}"), "reference")
    except OSError as exc:
        findings.add(
            Finding("integrity", f"{path.name}: cannot be read ({exc.strerror})"), "reference"
        )


def _named_file(
    folder: Path, key: str, entry: Mapping[str, Any], findings: FindingList
) -> Path | None:
    """Return the file a manifest entry names when it exists with its recorded size and hash."""
    rel = entry.get("path", "")
    try:
        path = inside_folder(folder, rel)
    except FormatError as exc:
        if exc.problem == MISSING:
            findings.add(Finding("integrity", str(exc)), "missing")
        else:
            findings.add(Finding("integrity", f"{key}: {exc}"), "outside")
        return None
    size = path.stat().st_size
    if "bytes" in entry and size != entry["bytes"]:
        findings.add(
            Finding("integrity", f"{rel}: {size} bytes, manifest says {entry['bytes']}"), "size"
        )
    try:
        digest = sha256_path(path)
    except OSError as exc:
        findings.add(Finding("integrity", f"{rel}: cannot be read ({exc.strerror})"), "unreadable")
        return None
    if digest != entry.get("sha256"):
        findings.add(Finding("integrity", f"{rel}: SHA-256 differs from the manifest"), "sha")
    return path


def check_counts(
    folder: Path,
    manifest: dict[str, Any],
    audits: dict[int, ShardAudit],
    index: ExamplesIndex | None,
    findings: FindingList,
) -> None:
    """Check per-shard counts, totals, the counting rule and the rejects file's lines."""
    stats = manifest.get("stats", {})

    def bad(message: str) -> None:
        findings.add(Finding("integrity", message), message[:30])

    for i, audit in audits.items():
        entry = manifest["shards"][i]
        for key, value in (
            ("rows", audit.rows),
            ("tokens", audit.tokens),
            ("loss_tokens", audit.loss_tokens),
        ):
            complete = key == "rows" or not len(audit.bad_rows)  # totals need sound rows
            if entry.get(key) != value and complete:
                bad(f"{entry['path']}: manifest says {key}={entry.get(key)}, shard has {value}")
    shards = manifest.get("shards", [])
    totals = [("stats", stats, shards)]
    for split, counts in (stats.get("splits") or {}).items():  # an eval split: each adds up
        mine = [s for s in shards if s.get("split", "train") == split]
        totals.append((f"stats.splits.{split}", counts, mine))
    for name, counts, entries in totals:
        for key in ("rows", "tokens", "loss_tokens"):
            value = sum(int(s.get(key, 0)) for s in entries)
            if counts.get(key) != value:
                bad(f"manifest {name}.{key}={counts.get(key)} but its shards add up to {value}")
    records = stats.get("records")
    parts = [stats.get(k) for k in RECORD_BINS]
    if None in parts or records != sum(parts):
        named = " + ".join(f"{k} {v}" for k, v in zip(RECORD_BINS, parts, strict=True))
        added = sum(p for p in parts if isinstance(p, int))
        bad(f"counting rule broken: records={records} != {named} = {added}")
    inputs_total = sum(int(i.get("records", 0)) for i in manifest.get("inputs", []))
    if inputs_total != records:
        bad(f"inputs list {inputs_total} records but stats.records={records}")
    _check_rejects(folder, manifest, parts, findings)
    domains = stats.get("domains", {})
    for key in DOMAIN_TOTALS:
        dsum = sum(int(d.get(key, 0)) for d in domains.values())
        if key in stats and dsum != stats[key]:
            bad(f"domains' {key} add up to {dsum}, stats.{key}={stats[key]}")
    if index is not None and stats.get("examples") != len(index.example_id):
        rows = len(index.example_id)
        bad(f"examples.parquet has {rows} rows, stats.examples={stats.get('examples')}")


def _check_rejects(
    folder: Path, manifest: dict[str, Any], parts: list[Any], findings: FindingList
) -> None:
    """Check that the rejects file parses line by line and holds rejected + dropped lines."""
    entry = manifest.get("files", {}).get("rejects", {})
    try:
        path = inside_folder(folder, entry.get("path", "rejects.jsonl"))
    except FormatError:
        return  # missing or outside the folder: already a finding
    if None in parts:
        return  # counts unknown
    try:
        lines = sum(1 for _ in read_rejects(path))
    except FormatError as exc:
        findings.add(Finding("integrity", str(exc)), "rejects")
        return
    except OSError as exc:
        findings.add(Finding("integrity", f"{path.name}: cannot be read ({exc})"), "rejects")
        return
    expected = parts[1] + parts[2]
    if lines != expected:
        why = f"rejects.jsonl has {lines} lines, manifest says rejected + dropped = {expected}"
        findings.add(Finding("integrity", why), "rejects")
