"""The source stage of ``verify``: rebuild examples from the inputs and compare them.

The manifest records every input's path and SHA-256, the tokenizer's hash and the template's
hash.  This stage finds those files again (at the recorded path, or by name under
``--source-root``; the tokenizer and template may also be given), refuses any whose hash
differs — a tokenizer swapped or a template edited after packing is a finding that says so —
and re-ingests the records with the recorded options.  Each packed segment must then equal
its example's slice ``[token_offset, token_offset + num_tokens)``: same ids, same labels
except the seam-masked first one, positions ``0 … n-1``.  Every record read must be in the
examples index or in ``rejects.jsonl``; nothing may be missing or invented.

Files are looked for under ``--source-root`` first (by recorded path, then by name), then at
the absolute path ``pack`` resolved (``resolved``, so verify finds them from any working
directory), then at the path as recorded.  When the inputs cannot be found the stage is
``not run`` — verify then cannot end OK — or, with ``--source``, a finding; only
``--no-source`` skips it.

The hashes pin the files, not the code that reads them: a tokenizers or jinja2 release can
change what the same tokenizer and template produce.  When the running versions differ from
the recorded ones (``drift``), every finding of a changed segment or record ends with the
drifted libraries as its likely cause.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packshard.engine import EngineOptions
from packshard.errors import FormatError, PackshardError
from packshard.format.environment import Drift, likely_cause
from packshard.format.examples import ExamplesIndex
from packshard.format.paths import inside_folder
from packshard.format.rejects import read_rejects
from packshard.format.shards import read_row
from packshard.ingest.chunks import ingest
from packshard.ingest.sources import InputFile
from packshard.ingest.templates import ChatTemplate
from packshard.ingest.tokenizer import TokenizerBundle
from packshard.records import IGNORE_INDEX, PackedRow
from packshard.verify.findings import CheckResult, Finding, FindingList
from packshard.verify.recorded import Mismatch, locate, resolve_template, resolve_tokenizer
from packshard.verify.turns import recorded_options, turn_check


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
        if path is None:
            if any(os.path.exists(p) for p in (entry["path"], entry.get("resolved") or "")):
                return failed(f"input {entry['path']} is not a regular file (not read)")
            return unavailable(f"input {entry['path']} not found (give --source-root)")
        if not same:
            return failed(f"input {entry['path']}: SHA-256 differs from the manifest")
        files.append(InputFile(path=entry["path"], real=path.resolve()))
    try:
        bundle, why = resolve_tokenizer(manifest, options)
        if bundle is None:
            return unavailable(str(why))
        template = resolve_template(manifest, bundle, options)
    except Mismatch as exc:
        return failed(str(exc), "mismatch")
    except PackshardError as exc:
        return failed(f"cannot load the recorded tokenizer/template: {exc}")
    if index is None:
        return unavailable("examples.parquet unreadable")
    try:
        rejected = _rejected(folder, manifest)
        compared = _compare(
            manifest, tables, index, rejected, files, bundle, template, options, findings, drift
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


def _compare(
    manifest: dict[str, Any],
    tables: dict[int, pa.Table],
    index: ExamplesIndex,
    rejected: set[tuple[str, int]],
    files: list[InputFile],
    bundle: TokenizerBundle,
    template: ChatTemplate | None,
    options: Any,
    findings: FindingList,
    drift: tuple[Drift, ...],
) -> tuple[int, dict[str, int]]:
    config = manifest["config"]
    cause = likely_cause(drift)
    by_record: dict[tuple[str, int], list[int]] = {}
    by_turn: dict[tuple[str, int, int], list[int]] = {}
    turns = index.turns.tolist() if index.turns is not None else [0] * len(index.lines)
    for pos, (src, line) in enumerate(zip(index.sources, index.lines.tolist(), strict=True)):
        by_record.setdefault((src, int(line)), []).append(pos)
        by_turn.setdefault((src, int(line), int(turns[pos])), []).append(pos)
    keys = sorted(by_record)
    if options.sample is not None and options.sample < len(keys):
        rng = np.random.default_rng(options.seed)
        chosen = {keys[i] for i in rng.choice(len(keys), options.sample, replace=False)}
    else:
        chosen = set(keys)
    opts = recorded_options(config)
    label_spans = manifest["template"].get("label_spans")
    engine = EngineOptions(options.engine, options.workers, options.ray_address)
    if not engine.serial:  # the re-ingest on workers (packshard.verify.units)
        from packshard.verify import units

        spec = units.template_spec(template, bundle)
        mask = np.array(
            [
                (s, int(ln)) in chosen
                for s, ln in zip(index.sources, index.lines.tolist(), strict=True)
            ],
            bool,
        )
        found = units.reingest_on_engine(
            files, bundle.path, spec, opts, label_spans, index, mask, engine
        )
        return units.compare_units(
            found, tables, manifest, index, by_record, rejected, findings, cause
        )
    check = turn_check(template, bundle, opts, label_spans)
    seen: set[tuple[str, int]] = set()
    compared = 0
    row_cache: dict[tuple[int, int], PackedRow] = {}
    for chunk in ingest(files, bundle, template, opts, progress=options.progress):
        for reject in chunk.rejects:
            key = (reject.ref.source, reject.ref.line)
            seen.add(key)
            if key not in rejected:
                findings.add(
                    Finding(
                        "source",
                        "record rejected on re-ingest but not in rejects.jsonl" + cause,
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
                            "record is neither packed nor in rejects.jsonl" + cause,
                            source=str(ref),
                        ),
                        "record_missing",
                    )
                continue
            if key not in chosen:
                continue
            ids, labels = batch.example(i)
            turn = int(batch.turns[i]) if batch.turns is not None else 0
            if check is not None:
                check.example(bundle.tokenizer, ids, labels, f"{ref}", turn, findings)
            for pos in by_turn.get((*key, turn), []):
                compared += _compare_segment(
                    tables, manifest, index, pos, ids, labels, row_cache, findings, cause
                )
    for key in sorted(set(by_record) - seen):
        findings.add(
            Finding(
                "source", "packed example has no record in the inputs", source=f"{key[0]}:{key[1]}"
            ),
            "invented",
        )
    return compared, check.counts() if check is not None else {}


def packed_segment(
    tables: dict[int, pa.Table],
    manifest: dict[str, Any],
    index: ExamplesIndex,
    pos: int,
    row_cache: dict[tuple[int, int], PackedRow],
    findings: FindingList,
) -> tuple[PackedRow, int, Callable[..., None]] | None:
    """Find index row ``pos``'s segment: its packed row, its segment, how to report on it.

    None when it cannot be read: a missing shard (already an integrity finding), a row past
    the shard's end or an example id not in its row (both findings here).
    """
    shard, row = int(index.shard[pos]), int(index.row[pos])
    eid = int(index.example_id[pos])
    where = index.where(eid)
    if shard not in tables:
        return None
    name = manifest["shards"][shard]["path"]
    if (shard, row) not in row_cache:
        if row >= tables[shard].num_rows:
            why = "examples.parquet points past the shard's last row"
            findings.add(Finding("source", why, name, row, None, eid, where))
            return None
        row_cache[(shard, row)] = read_row(tables[shard], row)
    packed = row_cache[(shard, row)]
    segs = np.flatnonzero(packed.example_ids == eid)
    if segs.size != 1:
        why = "example id not found in its row"
        findings.add(Finding("source", why, name, row, None, eid, where))
        return None
    seg = int(segs[0])

    def bad(message: str, because: str = "") -> None:
        findings.add(Finding("source", message + because, name, row, seg, eid, where), message[:20])

    return packed, seg, bad


def _compare_segment(
    tables: dict[int, pa.Table],
    manifest: dict[str, Any],
    index: ExamplesIndex,
    pos: int,
    ids: np.ndarray,
    labels: np.ndarray,
    row_cache: dict[tuple[int, int], PackedRow],
    findings: FindingList,
    cause: str,
) -> bool:
    """Compare one packed segment with its re-ingested example; False when it cannot be read."""
    found = packed_segment(tables, manifest, index, pos, row_cache, findings)
    if found is None:
        return False
    packed, seg, bad = found
    cu = packed.cu_seqlens
    if seg + 1 >= len(cu) or not 0 <= int(cu[seg]) <= int(cu[seg + 1]) <= len(packed.input_ids):
        bad("its row's cu_seqlens do not hold this segment (see structure)")
        return False
    lo, hi = int(cu[seg]), int(cu[seg + 1])
    n, offset = hi - lo, int(index.token_offset[pos])
    want_ids = ids[offset : offset + n]
    want_labels = labels[offset : offset + n].copy()
    if len(want_labels):
        want_labels[0] = IGNORE_INDEX
    if len(want_ids) != n or not np.array_equal(packed.input_ids[lo:hi], want_ids):
        bad("token ids differ from the source example re-tokenized", cause)
    elif not np.array_equal(packed.labels[lo:hi], want_labels):
        bad("labels differ from the source example's (loss policy not preserved)", cause)
    if not np.array_equal(packed.position_ids[lo:hi], np.arange(n)):
        bad("positions differ from the example's positions alone")
    return True
