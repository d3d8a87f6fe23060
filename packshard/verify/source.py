"""The source stage of ``verify``: rebuild examples from the inputs and compare them.

The manifest records every input's path and SHA-256, the tokenizer's hash and the template's
hash.  This stage finds those files again (at the recorded path, or by name under
``--source-root``; the tokenizer and template may also be given), refuses any whose hash
differs — a tokenizer swapped or a template edited after packing is a finding that says so —
and re-ingests the records with the recorded options.  Each packed segment must then equal
its example's slice ``[token_offset, token_offset + num_tokens)``: same ids, same labels
except the seam-masked first one, positions ``0 … n-1``.  Every record read must be in the
examples index or in ``rejects.jsonl``; nothing may be missing or invented.

When the inputs cannot be found the stage is skipped (or, with ``--source``, fails).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from packshard.errors import PackshardError
from packshard.verify.findings import Finding, FindingList
from packshard.records import IGNORE_INDEX
from packshard.verify.structure import ExamplesIndex


def _locate(recorded: str, root: str | None) -> Path | None:
    candidates = [Path(recorded)]
    if root:
        candidates += [Path(root) / recorded, Path(root) / Path(recorded).name]
    return next((p for p in candidates if p.exists()), None)


def _resolve_tokenizer(manifest: dict[str, Any], options: Any) -> tuple[Any, str | None]:
    from packshard.format.manifest import sha256_path
    from packshard.ingest.tokenizer import load_tokenizer

    recorded = manifest["tokenizer"]
    path = _locate(options.tokenizer or recorded["path"], options.source_root)
    if path is None:
        return None, f"tokenizer {recorded['path']} not found (give --tokenizer or --source-root)"
    bundle = load_tokenizer(str(path))
    json_path = path / "tokenizer.json" if path.is_dir() else path
    sha = sha256_path(json_path)
    if sha != recorded["sha256"]:
        raise _Mismatch(
            f"tokenizer {path}: SHA-256 {sha[:12]}… differs from {recorded['sha256'][:12]}… "
            "recorded at pack time (a different tokenizer gives different ids)"
        )
    return bundle, None


class _Mismatch(Exception):
    pass


def _resolve_template(manifest: dict[str, Any], bundle: Any, options: Any) -> Any:
    from packshard.ingest.templates import load_template

    recorded = manifest["template"]
    source = recorded.get("source")
    if source is None and options.template is None:
        return None
    if options.template:
        spec: str | None = options.template
    elif source == "tokenizer_config.json":
        spec = None
    elif source.startswith("builtin:"):
        spec = source.split(":", 1)[1]
    else:
        found = _locate(source, options.source_root)
        if found is None:
            raise _Mismatch(f"template {source} not found (give --template or --source-root)")
        spec = str(found)
    template = load_template(spec, bundle)
    sha = template.sha256 if template is not None else None
    if sha != recorded.get("sha256"):
        raise _Mismatch(
            f"template {template.source if template else source}: SHA-256 {str(sha)[:12]}… "
            f"differs from {str(recorded.get('sha256'))[:12]}… recorded at pack time "
            "(the template was edited or replaced after packing)"
        )
    return template


def check_sources(
    folder: Path,
    manifest: dict[str, Any],
    tables: dict[int, Any],
    index: ExamplesIndex | None,
    options: Any,
    findings: FindingList,
) -> dict[str, Any]:
    """Re-ingest the recorded inputs and compare every (or a sample of) packed example."""
    from packshard.format.manifest import sha256_path
    from packshard.ingest.sources import InputFile

    required = options.source is True

    def skip(why: str) -> dict[str, Any]:
        if required:
            findings.add(Finding("source", why))
            return {"status": "failed", "detail": why, "findings": findings.count("source")}
        return {"status": "skipped", "detail": why}

    files = []
    for entry in manifest.get("inputs", []):
        path = _locate(entry["path"], options.source_root)
        if path is None:
            return skip(f"input {entry['path']} not found (give --source-root)")
        if sha256_path(path) != entry["sha256"]:
            findings.add(
                Finding("source", f"input {entry['path']}: SHA-256 differs from the manifest")
            )
            return {"status": "failed", "findings": findings.count("source")}
        files.append(InputFile(path=entry["path"], real=path.resolve()))
    try:
        bundle, why = _resolve_tokenizer(manifest, options)
        if bundle is None:
            return skip(str(why))
        template = _resolve_template(manifest, bundle, options)
    except _Mismatch as exc:
        findings.add(Finding("source", str(exc)), "mismatch")
        return {"status": "failed", "findings": findings.count("source")}
    except PackshardError as exc:
        findings.add(Finding("source", f"cannot load the recorded tokenizer/template: {exc}"))
        return {"status": "failed", "findings": findings.count("source")}
    if index is None:
        return skip("examples.parquet unreadable")
    try:
        compared = _compare(
            folder, manifest, tables, index, files, bundle, template, options, findings
        )
    except PackshardError as exc:
        findings.add(Finding("source", f"re-ingesting the inputs failed: {exc}"))
        return {"status": "failed", "findings": findings.count("source")}
    return {
        "status": "passed" if findings.count("source") == 0 else "failed",
        "examples_compared": compared,
        "findings": findings.count("source"),
    }


def _compare(
    folder: Path,
    manifest: dict[str, Any],
    tables: dict[int, Any],
    index: ExamplesIndex,
    files: list[Any],
    bundle: Any,
    template: Any,
    options: Any,
    findings: FindingList,
) -> int:
    from packshard.ingest.chunks import IngestOptions, ingest

    config = manifest["config"]
    by_record: dict[tuple[str, int], list[int]] = {}
    for pos, (src, line) in enumerate(zip(index.sources, index.lines.tolist(), strict=True)):
        by_record.setdefault((src, int(line)), []).append(pos)
    rejected: set[tuple[str, int]] = set()
    rejects_path = folder / manifest["files"]["rejects"]["path"]
    if rejects_path.is_file():
        for line in rejects_path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                item = json.loads(line)
                rejected.add((item["source"], int(item["line"])))
    keys = sorted(by_record)
    if options.sample is not None and options.sample < len(keys):
        rng = np.random.default_rng(options.seed)
        chosen = {keys[i] for i in rng.choice(len(keys), options.sample, replace=False)}
    else:
        chosen = set(keys)
    offsets = pq.read_table(
        folder / manifest["files"]["examples"]["path"], columns=["token_offset"]
    )
    token_offset = offsets["token_offset"].to_numpy()
    opts = IngestOptions(
        format=config["format"], domain_field=config["domain_field"], loss=config["loss"]
    )
    seen: set[tuple[str, int]] = set()
    compared = 0
    row_cache: dict[tuple[int, int], Any] = {}
    for chunk in ingest(files, bundle, template, opts, progress=options.progress):
        for reject in chunk.rejects:
            key = (reject.ref.source, reject.ref.line)
            seen.add(key)
            if key not in rejected:
                findings.add(
                    Finding(
                        "source",
                        "record rejected on re-ingest but not in rejects.jsonl",
                        source=f"{key[0]}:{key[1]}",
                    ),
                    "reject_missing",
                )
        batch = chunk.batch
        for i, ref in enumerate(batch.refs):
            key = (ref.source, ref.line)
            seen.add(key)
            if key not in by_record:
                if key not in rejected:
                    findings.add(
                        Finding(
                            "source",
                            "record is neither packed nor in rejects.jsonl",
                            source=str(ref),
                        ),
                        "record_missing",
                    )
                continue
            if key not in chosen:
                continue
            ids, labels = batch.example(i)
            for pos in by_record[key]:
                compared += _compare_segment(
                    tables,
                    manifest,
                    index,
                    pos,
                    int(token_offset[pos]),
                    ids,
                    labels,
                    row_cache,
                    findings,
                )
    for key in sorted(set(by_record) - seen):
        findings.add(
            Finding(
                "source", "packed example has no record in the inputs", source=f"{key[0]}:{key[1]}"
            ),
            "invented",
        )
    return compared


def _compare_segment(
    tables: dict[int, Any],
    manifest: dict[str, Any],
    index: ExamplesIndex,
    pos: int,
    offset: int,
    ids: np.ndarray,
    labels: np.ndarray,
    row_cache: dict[tuple[int, int], Any],
    findings: FindingList,
) -> bool:
    """Compare one packed segment with its re-ingested example; False when it cannot be read."""
    from packshard.format.shards import read_row

    shard, row = int(index.shard[pos]), int(index.row[pos])
    eid = int(index.example_id[pos])
    where = index.where(eid)
    if shard not in tables:
        return False  # missing or unreadable shard: already an integrity finding
    name = manifest["shards"][shard]["path"]
    if (shard, row) not in row_cache:
        if row >= tables[shard].num_rows:
            findings.add(
                Finding(
                    "source",
                    "examples.parquet points past the shard's last row",
                    name,
                    row,
                    None,
                    eid,
                    where,
                )
            )
            return False
        row_cache[(shard, row)] = read_row(tables[shard], row)
    packed = row_cache[(shard, row)]
    segs = np.flatnonzero(packed.example_ids == eid)
    if segs.size != 1:
        findings.add(
            Finding("source", "example id not found in its row", name, row, None, eid, where)
        )
        return False
    seg = int(segs[0])
    lo, hi = int(packed.cu_seqlens[seg]), int(packed.cu_seqlens[seg + 1])
    n = hi - lo
    want_ids = ids[offset : offset + n]
    want_labels = labels[offset : offset + n].copy()
    if len(want_labels):
        want_labels[0] = IGNORE_INDEX

    def bad(message: str) -> None:
        findings.add(Finding("source", message, name, row, seg, eid, where), message[:20])

    if len(want_ids) != n or not np.array_equal(packed.input_ids[lo:hi], want_ids):
        bad("token ids differ from the source example re-tokenized")
    elif not np.array_equal(packed.labels[lo:hi], want_labels):
        bad("labels differ from the source example's (loss policy not preserved)")
    if not np.array_equal(packed.position_ids[lo:hi], np.arange(n)):
        bad("positions differ from the example's positions alone")
    return True
