"""``verify``: prove that a packed folder's seams hold, and that the proof itself can fail.

Checks, in order (each reports findings pinned to shard, row, segment and source line):

1. **integrity** — the manifest validates against its schema and format version; every file it
   names exists with the recorded size and SHA-256; shard metadata carries the dataset id;
   per-shard and total counts agree; the counting rule holds
   (``records = records_packed + rejected + dropped``, ``rejects.jsonl`` has
   ``rejected + dropped`` lines, domains add up).  Files the manifest does not name are
   never read.
2. **structure** — every row of every shard, vectorised (``seams.audit_shard``), and every
   example id exactly once across shards, matching the examples index.
3. **source** — re-ingest the recorded inputs with the recorded tokenizer and template (hashes
   must match) and compare each example's ids, labels and positions with its packed segment
   (``provenance``).
4. **model** — a small causal model gives the same logits for each example packed as alone,
   mutating neighbours changes nothing, and a naive causal mask over the same rows is caught
   leaking (``equivalence``).  If the control is not caught, verify itself is broken.

Exit status: 0 when every check holds, 1 on any finding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from packshard.errors import ManifestError
from packshard.verify.findings import MAX_PER_KIND, Finding, FindingList
from packshard.format.manifest import (
    META_DATASET_ID,
    META_FORMAT_VERSION,
    check_format_version,
    load_manifest,
    schema_errors,
    sha256_path,
)
from packshard.verify.structure import ExamplesIndex, ShardAudit, audit_shard
from packshard.format.shards import SHARD_SCHEMA

CHECKS = ("integrity", "structure", "source", "model")


@dataclass(frozen=True, slots=True)
class VerifyOptions:
    """How thoroughly to verify; ``source=None`` means "when the inputs are found"."""

    source: bool | None = None
    source_root: str | None = None
    tokenizer: str | None = None
    template: str | None = None
    model: str = "tiny"  # "tiny", a local model folder, or "none"
    model_rows: int = 8
    model_max_tokens: int = 2048  # longer rows are cut after a whole segment (see modelcheck)
    sample: int | None = None
    seed: int = 0
    progress: bool = False


@dataclass
class VerifyReport:
    """Everything verify found and measured."""

    out: str
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: FindingList = field(default_factory=FindingList)
    seam_table: list[dict[str, Any]] = field(default_factory=list)
    equivalence: Any = None
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no check produced a finding."""
        return len(self.findings) == 0

    def to_dict(self) -> dict[str, Any]:
        """JSON form: checks, findings, the seam table and the model report."""
        return {
            "out": self.out,
            "ok": self.ok,
            "checks": self.checks,
            "findings": [f.to_dict() for f in self.findings.items],
            "findings_not_listed": self.findings.overflow,
            "seam_table": self.seam_table,
            "model": self.equivalence.to_dict() if self.equivalence is not None else None,
        }


def verify_dataset(out: str | Path, options: VerifyOptions | None = None) -> VerifyReport:
    """Run every check on a packed folder and return the report (never raises on findings)."""
    options = options or VerifyOptions()
    folder = Path(out)
    manifest = _read_manifest(folder)
    report = VerifyReport(out=str(folder), manifest=manifest)
    findings = report.findings
    for problem in schema_errors(manifest):
        findings.add(Finding("integrity", problem), "schema")
    tables, index = _check_files(folder, manifest, findings)
    report.checks["integrity"] = _status(findings, "integrity")
    audits = _check_structure(manifest, tables, index, findings)
    report.checks["structure"] = _status(findings, "structure")
    _check_counts(folder, manifest, audits, index, findings)
    report.checks["integrity"] = _status(findings, "integrity")
    report.seam_table = _seam_table(manifest, audits)
    invalid = findings.count_kind("integrity", "schema") > 0
    if options.source is False:
        report.checks["source"] = {"status": "skipped", "detail": "--no-source"}
    elif invalid:
        report.checks["source"] = {"status": "skipped", "detail": "the manifest is invalid"}
    else:
        from packshard.verify.source import check_sources

        report.checks["source"] = check_sources(folder, manifest, tables, index, options, findings)
    if options.model == "none":
        report.checks["model"] = {"status": "skipped", "detail": "--model none"}
    elif invalid:
        report.checks["model"] = {"status": "skipped", "detail": "the manifest is invalid"}
    else:
        from packshard.verify.model import check_model

        report.checks["model"], report.equivalence = check_model(
            manifest, tables, options, findings, report.seam_table, index
        )
    _count_placed(report)
    return report


def _count_placed(report: VerifyReport) -> None:
    """Add the listed source and model findings of each row to its seam-table entry."""
    placed = [
        (f.shard, f.row)
        for f in report.findings.items
        if f.check in ("source", "model") and f.shard is not None and f.row is not None
    ]
    if not placed:
        return
    entries = {(e["shard"], e["row"]): e for e in report.seam_table}
    for key in placed:
        if key in entries:
            entries[key]["findings"] += 1


def _read_manifest(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise ManifestError(f"{folder}: not a folder (give the OUT folder that pack wrote)")
    manifest = load_manifest(folder, validate=False)
    check_format_version(manifest.get("format_version"), str(folder / "manifest.json"))
    return manifest


def _status(findings: FindingList, check: str) -> dict[str, Any]:
    n = findings.count(check)
    return {"status": "passed" if n == 0 else "failed", "findings": n}


def _check_files(
    folder: Path, manifest: dict[str, Any], findings: FindingList
) -> tuple[dict[int, Any], ExamplesIndex | None]:
    """Existence, size and checksum of every named file; open the readable ones."""
    tables: dict[int, Any] = {}
    dataset_id = str(manifest.get("dataset_id", "")).encode()
    named = [(f"files/{k}", v) for k, v in sorted(manifest.get("files", {}).items())]
    for i, entry in enumerate(manifest.get("shards", [])):
        named.append((f"shards/{i}", entry))
    for key, entry in named:
        rel = str(entry.get("path", ""))
        path = folder / rel
        if not rel or ".." in Path(rel).parts or Path(rel).is_absolute():
            findings.add(Finding("integrity", f"{key}: path {rel!r} is not inside the folder"))
            continue
        if not path.is_file():
            findings.add(
                Finding("integrity", f"{rel}: listed in the manifest but missing"), "missing"
            )
            continue
        if "bytes" in entry and path.stat().st_size != entry["bytes"]:
            findings.add(
                Finding(
                    "integrity",
                    f"{rel}: {path.stat().st_size} bytes, manifest says {entry['bytes']}",
                ),
                "size",
            )
        if sha256_path(path) != entry.get("sha256"):
            findings.add(Finding("integrity", f"{rel}: SHA-256 differs from the manifest"), "sha")
        if key.startswith("shards/"):
            try:
                table = pq.read_table(path, memory_map=True)
            except Exception as exc:  # any decode failure is a finding
                findings.add(Finding("integrity", f"{rel}: unreadable Parquet: {exc}"), "parquet")
                continue
            problem = _schema_problem(table.schema)
            if problem:
                findings.add(Finding("integrity", f"{rel}: {problem}"), "shard_schema")
                continue
            meta = table.schema.metadata or {}
            if meta.get(META_FORMAT_VERSION) != str(manifest.get("format_version")).encode():
                findings.add(
                    Finding("integrity", f"{rel}: format version metadata missing or wrong")
                )
            if meta.get(META_DATASET_ID) != dataset_id:
                findings.add(Finding("integrity", f"{rel}: dataset id differs from the manifest's"))
            tables[int(key.split("/")[1])] = table
    index = None
    ex_entry = manifest.get("files", {}).get("examples", {})
    ex_path = folder / str(ex_entry.get("path", "examples.parquet"))
    if ex_path.is_file():
        try:
            index = ExamplesIndex.from_table(pq.read_table(ex_path))
        except Exception as exc:  # any decode failure is a finding
            findings.add(Finding("integrity", f"{ex_path.name}: unreadable: {exc}"))
    return tables, index


def _schema_problem(schema: Any) -> str | None:
    """Say what is wrong with a shard's columns, or None when they match the contract."""
    missing = [c for c in SHARD_SCHEMA.names if c not in schema.names]
    if missing:
        return f"missing columns {', '.join(missing)} (not a format version 1 shard)"
    for name in SHARD_SCHEMA.names:
        want, got = SHARD_SCHEMA.field(name).type, schema.field(name).type
        if got != want:
            return f"column {name} is {got}, the contract says {want}"
    return None


def _check_structure(
    manifest: dict[str, Any],
    tables: dict[int, Any],
    index: ExamplesIndex | None,
    findings: FindingList,
) -> dict[int, ShardAudit]:
    # Without a recorded max_seq_len (an invalid manifest, already a finding) skip capacity.
    max_seq_len = int(manifest.get("config", {}).get("max_seq_len") or np.iinfo(np.int32).max)
    vocab_size = int(manifest.get("tokenizer", {}).get("vocab_size") or 0) or None
    audits = {}
    for i, table in sorted(tables.items()):
        name = manifest["shards"][i]["path"]
        audits[i] = audit_shard(table, name, i, max_seq_len, index, findings, vocab_size)
    return audits


def _check_counts(
    folder: Path,
    manifest: dict[str, Any],
    audits: dict[int, ShardAudit],
    index: ExamplesIndex | None,
    findings: FindingList,
) -> None:
    """Check the counting rule, per-shard counts, and every example exactly once."""
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
    total = {
        k: sum(int(s.get(k, 0)) for s in manifest.get("shards", []))
        for k in ("rows", "tokens", "loss_tokens")
    }
    for key, value in total.items():
        if stats.get(key) != value:
            bad(f"manifest stats.{key}={stats.get(key)} but its shards add up to {value}")
    records = stats.get("records")
    parts = [stats.get(k) for k in ("records_packed", "rejected", "dropped")]
    if None in parts or records != sum(parts):
        named = " + ".join(
            f"{k} {v}"
            for k, v in zip(("records_packed", "rejected", "dropped"), parts, strict=True)
        )
        added = sum(p for p in parts if isinstance(p, int))
        bad(f"counting rule broken: records={records} != {named} = {added}")
    inputs_total = sum(int(i.get("records", 0)) for i in manifest.get("inputs", []))
    if inputs_total != records:
        bad(f"inputs list {inputs_total} records but stats.records={records}")
    rejects_entry = manifest.get("files", {}).get("rejects", {})
    rejects_path = folder / str(rejects_entry.get("path", "rejects.jsonl"))
    if rejects_path.is_file() and None not in parts:
        with open(rejects_path, encoding="utf-8") as fh:
            lines = sum(1 for line in fh if line.strip())
        if lines != parts[1] + parts[2]:
            expected = parts[1] + parts[2]
            bad(f"rejects.jsonl has {lines} lines, manifest says rejected + dropped = {expected}")
    domains = stats.get("domains", {})
    for key in (
        "records",
        "records_packed",
        "rejected",
        "dropped",
        "examples",
        "tokens",
        "loss_tokens",
    ):
        dsum = sum(int(d.get(key, 0)) for d in domains.values())
        if key in stats and dsum != stats[key]:
            bad(f"domains' {key} add up to {dsum}, stats.{key}={stats[key]}")
    if len(audits) != len(manifest.get("shards", [])) or index is None:
        return
    seen = np.concatenate([a.example_ids for a in audits.values()]) if audits else np.zeros(0)
    seen = seen.astype(np.int64, copy=False)
    n = len(index.example_id)
    if index.dense and (not len(seen) or (seen.min() >= 0 and seen.max() < n)):
        times = np.bincount(seen, minlength=n)  # O(n), the common case
        duplicated, missing = np.flatnonzero(times > 1), np.flatnonzero(times == 0)
    else:
        uniq, counts = np.unique(seen, return_counts=True)
        duplicated, missing = uniq[counts > 1], np.setdiff1d(index.example_id, uniq)
    findings.add_unlisted("structure", "duplicate", len(duplicated) - MAX_PER_KIND)
    findings.add_unlisted("structure", "missing_example", len(missing) - MAX_PER_KIND)
    for eid in duplicated[:MAX_PER_KIND]:
        findings.add(
            Finding(
                "structure",
                "example appears more than once across shards",
                example_id=int(eid),
                source=index.where(int(eid)),
            ),
            "duplicate",
        )
    for eid in missing[:MAX_PER_KIND]:
        findings.add(
            Finding(
                "structure",
                "example listed in examples.parquet is in no row",
                example_id=int(eid),
                source=index.where(int(eid)),
            ),
            "missing_example",
        )
    if stats.get("examples") != len(index.example_id):
        rows = len(index.example_id)
        bad(f"examples.parquet has {rows} rows, stats.examples={stats.get('examples')}")


def _seam_table(manifest: dict[str, Any], audits: dict[int, ShardAudit]) -> list[dict[str, Any]]:
    """One entry per stored row: segments, seams, structural findings (model deltas later)."""
    table: list[dict[str, Any]] = []
    for i, audit in sorted(audits.items()):
        name = manifest["shards"][i]["path"]
        segments = np.zeros(audit.rows, dtype=np.int64)
        known = min(audit.rows, len(audit.segments))
        segments[:known] = np.maximum(audit.segments[:known], 0)
        seams = np.maximum(segments - 1, 0)
        table.extend(
            {
                "shard": name,
                "row": r,
                "segments": s,
                "seams_checked": c,
                "max_logit_delta": None,
                "findings": f,
            }
            for r, (s, c, f) in enumerate(
                zip(segments.tolist(), seams.tolist(), audit.row_findings.tolist(), strict=True)
            )
        )
    return table


def write_report_json(report: VerifyReport, path: str | Path) -> None:
    """Write the full report (with the seam table) as JSON."""
    Path(path).write_text(
        json.dumps(report.to_dict(), indent=2, sort_keys=True, default=str) + "\n"
    )
