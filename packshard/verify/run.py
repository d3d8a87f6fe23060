"""``verify``: prove that a packed folder's seams hold, and that the proof itself can fail.

Checks, in order (each returns a :class:`~packshard.verify.findings.CheckResult`, its findings
pinned to shard, row, segment and source line):

1. **integrity** (:mod:`~packshard.verify.integrity`) — schema, format version, every file's
   size, SHA-256 and metadata, counts and the counting rule;
2. **structure** (:mod:`~packshard.verify.structure`) — every row of every shard, vectorised,
   and every example id exactly once across shards, matching the examples index;
3. **source** (:mod:`~packshard.verify.source`) — re-ingest the recorded inputs with the
   recorded tokenizer and template (hashes must match) and compare each example's ids, labels
   and positions with its packed segment;
4. **model** (:mod:`~packshard.verify.model.forward`, :mod:`~packshard.verify.model.equivalence`) —
   a small causal model gives the same logits for each example packed as alone, mutating
   neighbours changes nothing, and a naive causal mask over the same rows is caught leaking.
   If the control is not caught, verify itself is broken;
5. **vision** (:mod:`~packshard.verify.model.vision`, packs with images only) — every image
   re-hashed, and a tiny Qwen2.5-VL gives the same logits packed (four-row positions) as
   alone, while three wrong position forms are caught.

Before the checks, the running versions are compared with the recorded ones
(:mod:`~packshard.format.environment`): each difference is one drift line, no finding by
itself.  The report records the versions verify ran with and the model stage's tolerance.

Statuses, the merged findings and the seam table (one entry per stored row: segments, seams,
findings, model deltas) are computed once, at the end, from what the checks returned.  Exit
status: 0 when every check holds, 1 on any finding.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from packshard.errors import ManifestError
from packshard.format.environment import Drift, environment_drift, running_environment
from packshard.format.examples import has_media
from packshard.format.manifest import load_manifest
from packshard.ingest import template_conventions
from packshard.options import MAX_SEED, check_range
from packshard.store import fetched_out, is_url
from packshard.verify.findings import NOT_RUN, CheckResult, EquivalenceReport, FindingList
from packshard.verify.integrity import check_counts, check_files
from packshard.verify.model.equivalence import CONTROL_FLOOR, DEFAULT_ATOL
from packshard.verify.model.vision import check_vision
from packshard.verify.stages import StageClock
from packshard.verify.structure import ShardAudit, check_structure


@dataclass(frozen=True, slots=True)
class VerifyOptions:
    """How thoroughly to verify; ``source=None`` means "when the inputs are found"."""

    source: bool | None = None
    source_root: str | None = None
    tokenizer: str | None = None
    template: str | None = None
    model: str = "tiny"  # "tiny", a local model folder, or "none"
    model_config: str | None = None  # any architecture's config.json, built tiny and random
    model_rows: int = 8
    model_max_tokens: int = 2048  # longer rows are cut after a whole segment (see model)
    sample: int | None = None
    seed: int = 0
    progress: bool = False
    engine: str = "local"  # the source check's re-ingest: one process, local workers, Ray
    workers: int | None = 1  # None: --workers auto, sized by the inputs re-ingested
    ray_address: str | None = None

    def check(self) -> None:
        """Refuse an option out of range, before anything is read.

        Raises :class:`~packshard.errors.UsageError`.
        """
        if self.sample is not None:
            check_range("--sample", self.sample, 1, MAX_SEED)
        check_range("--model-rows", self.model_rows, 1, 1 << 20)
        check_range("--seed", self.seed, 0, MAX_SEED)
        check_range("model_max_tokens", self.model_max_tokens, 2, 1 << 24)


@dataclass
class VerifyReport:
    """Everything verify found and measured."""

    out: str
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: FindingList = field(default_factory=FindingList)
    seam_table: list[dict[str, Any]] = field(default_factory=list)
    equivalence: EquivalenceReport | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    drift: tuple[Drift, ...] = ()

    @property
    def not_run(self) -> dict[str, str]:
        """The checks that were asked for but could not run, with the reason."""
        return {name: c["detail"] for name, c in self.checks.items() if c["status"] == NOT_RUN}

    @property
    def ok(self) -> bool:
        """True when no check produced a finding and every check asked for ran."""
        return len(self.findings) == 0 and not self.not_run

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
            "environment": self.environment,
            "drift": [d.to_dict() for d in self.drift],
        }


def verify_dataset(out: str | Path, options: VerifyOptions | None = None) -> VerifyReport:
    """Run every check on a packed folder and return the report (never raises on findings)."""
    options = options or VerifyOptions()
    options.check()
    if is_url(out):  # every byte is checked: the pack is fetched whole, manifest first
        with fetched_out(str(out)) as local:
            return replace(verify_dataset(local, options), out=str(out))
    folder = Path(out)
    if not folder.is_dir():
        raise ManifestError(f"{folder}: not a folder (give the OUT folder that pack wrote)")
    manifest = load_manifest(folder, validate=False)
    environment = running_environment(template_conventions())
    environment["tolerance"] = {"atol": DEFAULT_ATOL, "control_floor": CONTROL_FLOOR}
    drift = environment_drift(manifest, environment)
    integrity, structure = FindingList(), FindingList()
    clock = StageClock(options.progress)
    with clock.stage("integrity"):
        opened = check_files(folder, manifest, integrity)
    invalid = None if opened.schema_valid else "the manifest is invalid (see integrity)"
    audits: dict[int, ShardAudit] = {}
    if invalid is None:
        with clock.stage("structure"):
            audits = check_structure(manifest, opened.tables, opened.index, structure)
        with clock.stage("integrity", "integrity (counts)"):
            check_counts(folder, manifest, audits, opened.index, integrity)
    results = [
        CheckResult("integrity", integrity),
        CheckResult("structure", structure, not_run=invalid),
    ]
    if invalid or options.source is False:
        results.append(CheckResult("source", skipped="--no-source", not_run=invalid))
    else:
        from packshard.verify.source import check_sources

        with clock.stage("source"):
            source = check_sources(folder, manifest, opened.tables, opened.index, options, drift)
        results.append(source)
    equivalence: EquivalenceReport | None = None
    picks: list[tuple[int, int]] = []
    if invalid or options.model == "none":
        results.append(CheckResult("model", skipped="--model none", not_run=invalid))
    else:
        from packshard.verify.model.check import check_model

        sound = {i: t for i, t in opened.tables.items() if i in audits}
        bad = {i: a.bad_rows for i, a in audits.items() if len(a.bad_rows)}
        with clock.stage("model"):
            model, equivalence, picks = check_model(manifest, sound, opened.index, options, bad)
        results.append(model)
    if invalid is None and has_media(folder):  # a pack with images: files and the VLM proof
        with clock.stage("vision"):
            results.append(check_vision(folder, options))
    findings = FindingList()
    for result in results:
        findings.extend(result.findings)
    return VerifyReport(
        out=str(folder),
        checks={r.name: _timed(r.summary(), clock.seconds.get(r.name)) for r in results},
        findings=findings,
        seam_table=seam_table(manifest, audits, findings, equivalence, picks),
        equivalence=equivalence,
        manifest=manifest,
        environment=environment,
        drift=drift,
    )


def _timed(summary: dict[str, Any], seconds: float | None) -> dict[str, Any]:
    return summary if seconds is None else {**summary, "seconds": round(seconds, 3)}


def seam_table(
    manifest: dict[str, Any],
    audits: dict[int, ShardAudit],
    findings: FindingList,
    equivalence: EquivalenceReport | None,
    picks: list[tuple[int, int]],
) -> list[dict[str, Any]]:
    """One entry per stored row: segments, seams, findings, and the model's deltas."""
    placed = Counter(
        (f.shard, f.row)
        for f in findings.items
        if f.check in ("source", "model") and f.shard is not None and f.row is not None
    )
    deltas: dict[tuple[str, int], tuple[float | None, float | None]] = {}
    for result in equivalence.rows if equivalence is not None else ():
        shard, row = picks[result.row]
        deltas[(manifest["shards"][shard]["path"], row)] = (
            result.max_logit_delta,
            result.control_delta,
        )
    table: list[dict[str, Any]] = []
    for i, audit in sorted(audits.items()):
        name = manifest["shards"][i]["path"]
        segments = np.maximum(audit.segments, 0).tolist()  # an empty cu_seqlens (-1) shows 0
        for r, (s, f) in enumerate(zip(segments, audit.row_findings.tolist(), strict=True)):
            entry: dict[str, Any] = {
                "shard": name,
                "row": r,
                "segments": s,
                "seams_checked": max(s - 1, 0),
                "max_logit_delta": None,
                "findings": f + placed[(name, r)],
            }
            if (name, r) in deltas:
                entry["max_logit_delta"], entry["control_delta"] = deltas[(name, r)]
            table.append(entry)
    return table


def write_report_json(report: VerifyReport, path: str | Path) -> None:
    """Write the full report (with the seam table) as JSON."""
    Path(path).write_text(
        json.dumps(report.to_dict(), indent=2, sort_keys=True, default=str) + "\n"
    )
