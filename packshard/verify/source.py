"""The source stage of ``verify``: rebuild examples from the inputs and compare them.

The manifest records every input's path and SHA-256, the tokenizer's hash and the template's
hash.  This stage finds those files again (at the recorded path, or by name under
``--source-root``; the tokenizer and template may also be given), refuses any whose hash
differs — a tokenizer swapped or a template edited after packing is a finding that says so —
and re-ingests the records with the recorded options.  Each packed segment must then equal
its example's slice ``[token_offset, token_offset + num_tokens)``: same ids, same labels
except the seam-masked first one, positions ``0 … n-1``.  Every record read must be in the
examples index or in ``rejects.jsonl``.  This module finds and checks the files; the
re-ingest and comparison run as engine tasks (:mod:`packshard.verify.reingest`).

Files are looked for under ``--source-root`` (by recorded path, then by name), then at the
absolute path ``pack`` resolved, then as recorded.  Inputs not found make the stage ``not
run`` (verify cannot end OK), a finding with ``--source``; only ``--no-source`` skips it.
The hashes pin the files, not the code that reads them: a changed segment's finding names
the libraries whose versions drifted (:mod:`packshard.format.environment`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packshard.engine import EngineOptions
from packshard.errors import FormatError, PackshardError
from packshard.format.environment import Drift, encoded_by, likely_cause
from packshard.format.examples import ExamplesIndex
from packshard.format.folder.paths import inside_folder
from packshard.format.rejects import read_rejects
from packshard.ingest import InputFile, input_bytes
from packshard.store import fetch_input, is_url, parse_url
from packshard.verify.findings import CheckResult, Finding, FindingList
from packshard.verify.recorded import Mismatch, locate, open_recorded
from packshard.verify.reingest import compare_units, reingest_on_engine


def check_sources(
    folder: Path,
    manifest: dict[str, Any],
    tables: dict[int, pa.Table],
    index: ExamplesIndex | None,
    options: Any,
    drift: tuple[Drift, ...] = (),
) -> CheckResult:
    """Re-ingest the recorded inputs and compare every (or a sample of) packed example.

    ``drift`` (the environment's differences from the manifest's) is named as the likely
    cause in the findings of changed segments and records.
    """
    findings = FindingList()

    def failed(message: str, kind: str | None = None) -> CheckResult:
        findings.add(Finding("source", message), kind)
        return CheckResult("source", findings)

    def unavailable(why: str) -> CheckResult:
        return failed(why) if options.source is True else CheckResult("source", not_run=why)

    files = []
    for entry in manifest.get("inputs", []):
        path, same = locate(
            entry["path"], options.source_root, entry.get("resolved"), sha256=entry["sha256"]
        )
        if path is None and is_url(entry["path"]):  # an input on a store: fetched here
            try:
                staged = fetch_input(parse_url(entry["path"]))
            except PackshardError as exc:
                return unavailable(f"input {entry['path']}: {exc}")
            path, same = locate(str(staged), None, sha256=entry["sha256"])
        if path is None:
            if any(os.path.exists(p) for p in (entry["path"], entry.get("resolved") or "")):
                return failed(f"input {entry['path']} is not a regular file (not read)")
            return unavailable(f"input {entry['path']} not found (give --source-root)")
        if not same:
            return failed(f"input {entry['path']}: SHA-256 differs from the manifest")
        files.append(InputFile(path=entry["path"], real=path.resolve()))
    try:
        stage, why = open_recorded(manifest, options)
        if stage is None:
            return unavailable(str(why))
    except Mismatch as exc:
        return failed(str(exc), "mismatch")
    except PackshardError as exc:
        return failed(f"cannot load the recorded tokenizer/template: {exc}")
    if index is None:
        return unavailable("examples.parquet unreadable")
    cause = encoded_by(manifest) + likely_cause(drift)
    records = [(s, int(line)) for s, line in zip(index.sources, index.lines.tolist(), strict=True)]
    keys = sorted(set(records))  # every packed record once
    if options.sample is not None and options.sample < len(keys):
        rng = np.random.default_rng(options.seed)
        chosen = {keys[i] for i in rng.choice(len(keys), options.sample, replace=False)}
    else:
        chosen = set(keys)
    mask = np.array([record in chosen for record in records], bool)
    label_spans = manifest["template"].get("label_spans")
    engine = EngineOptions(options.engine, options.workers, options.ray_address)
    engine = engine.sized(input_bytes(files))  # --workers auto
    try:
        rejected = _rejected(folder, manifest)
        with stage.shared():
            found = reingest_on_engine(
                files, stage.spec, label_spans, index, mask, engine, options.progress
            )
        compared = compare_units(
            found, tables, manifest, index, set(keys), rejected, findings, cause
        )
    except PackshardError as exc:
        return failed(f"re-ingesting the inputs failed: {exc}")
    return CheckResult("source", findings, {"examples_compared": compared[0], **compared[1]})


def _rejected(folder: Path, manifest: dict[str, Any]) -> set[tuple[str, int]]:
    """Return the ``(source, line)`` of every record in the rejects file."""
    try:
        path = inside_folder(folder, manifest["files"]["rejects"]["path"])
        return {(r.ref.source, r.ref.line) for r in read_rejects(path)}
    except (FormatError, OSError):
        return set()  # a damaged, missing or outside rejects file is an integrity finding
