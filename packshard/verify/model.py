"""The model stage of ``verify``: pick rows, crop them, and run the equivalence proof.

Rows are sampled with the seed, preferring rows with two or more segments (a row holding one
example has no seam to leak across).  A row longer than ``model_max_tokens`` is cut after its
last whole segment that fits: attention is causal, so logits of a prefix do not depend on what
follows, and the cut row is still a valid packed row.  torch and transformers are imported
only here, so ``verify --model none`` and the other checks work without them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packshard.verify.findings import Finding, FindingList
from packshard.records import PackedRow
from packshard.format.shards import read_row


def crop_row(row: PackedRow, max_tokens: int) -> PackedRow:
    """Keep the leading whole segments of ``row`` that fit in ``max_tokens`` (at least one)."""
    cu = row.cu_seqlens
    keep = int(np.searchsorted(cu, max_tokens, side="right")) - 1
    keep = max(keep, 1)
    end = int(cu[keep])
    if end >= row.num_tokens:
        return row
    return PackedRow(
        input_ids=row.input_ids[:end],
        labels=row.labels[:end],
        position_ids=row.position_ids[:end],
        cu_seqlens=cu[: keep + 1],
        example_ids=row.example_ids[:keep],
    )


def pick_rows(
    manifest: dict[str, Any], tables: dict[int, Any], count: int, seed: int
) -> list[tuple[int, int]]:
    """Choose up to ``count`` (shard, row) pairs, multi-segment rows first, seeded."""
    multi: list[tuple[int, int]] = []
    single: list[tuple[int, int]] = []
    for shard, table in sorted(tables.items()):
        lengths = np.diff(np.asarray(table["cu_seqlens"].combine_chunks().offsets)) - 1
        for r in np.flatnonzero(lengths >= 2):
            multi.append((shard, int(r)))
        for r in np.flatnonzero(lengths < 2):
            single.append((shard, int(r)))
    rng = np.random.default_rng(seed)
    chosen = [multi[i] for i in rng.permutation(len(multi))[:count]]
    if len(chosen) < count:
        chosen += [single[i] for i in rng.permutation(len(single))[: count - len(chosen)]]
    return sorted(chosen)


def place_finding(
    message: str,
    picks: list[tuple[int, int]],
    names: list[str],
    rows: list[PackedRow],
    index: Any = None,
) -> Finding:
    """Turn an equivalence message (``"NAME segment J: …"`` or ``"NAME: …"``) into a placed finding.

    ``index`` (an :class:`~packshard.verify.structure.ExamplesIndex`) adds the segment's ``file:line``.
    """
    for (_, row), name, packed in zip(picks, names, rows, strict=True):
        shard_path = name.rsplit(" row ", 1)[0]
        if message.startswith(f"{name}: "):
            return Finding("model", message[len(name) + 2 :], shard_path, row)
        if message.startswith(f"{name} segment "):
            number, _, rest = message[len(name) + 9 :].partition(": ")
            if not number.isdigit() or not rest:
                break
            seg = int(number)
            eid = int(packed.example_ids[seg]) if seg < len(packed.example_ids) else None
            source = index.where(eid) if index is not None and eid is not None else None
            return Finding("model", rest, shard_path, row, seg, eid, source)
    return Finding("model", message)


def check_model(
    manifest: dict[str, Any],
    tables: dict[int, Any],
    options: Any,
    findings: FindingList,
    seam_table: list[dict[str, Any]],
    index: Any = None,
) -> tuple[dict[str, Any], Any]:
    """Run the equivalence proof on sampled rows; add findings; fill the seam table's deltas."""
    try:
        from packshard.verify.equivalence import check_rows, load_model
    except ImportError as exc:  # torch missing
        return {"status": "skipped", "detail": f"needs torch and transformers ({exc})"}, None
    picks = pick_rows(manifest, tables, options.model_rows, options.seed)
    if not picks:
        return {"status": "skipped", "detail": "no rows to check"}, None
    rows = [crop_row(read_row(tables[s], r), options.model_max_tokens) for s, r in picks]
    names = [f"{manifest['shards'][s]['path']} row {r}" for s, r in picks]
    recorded = int(manifest.get("tokenizer", {}).get("vocab_size", 0) or 0)
    largest = max((int(r.input_ids.max()) for r in rows if r.num_tokens), default=0)
    vocab = max(recorded, largest + 1, 2)
    model = load_model(options.model, vocab, seed=options.seed)
    report = check_rows(model, rows, names=names, seed=options.seed)
    for message in report.findings:
        findings.add(place_finding(message, picks, names, rows, index), "model")
    if not report.control_detected and any(r.control_delta is not None for r in report.rows):
        findings.add(Finding("model", "the naive-mask control was not detected: verify is broken"))
    lookup = {(e["shard"], e["row"]): e for e in seam_table}
    for result in report.rows:
        shard, row = picks[result.row]
        entry = lookup.get((manifest["shards"][shard]["path"], row))
        if entry is not None:
            entry["max_logit_delta"] = result.max_logit_delta
            entry["control_delta"] = result.control_delta
    status = "passed" if report.ok and findings.count("model") == 0 else "failed"
    detail = {
        "status": status,
        "rows": len(rows),
        "atol": report.atol,
        "max_logit_delta": report.max_logit_delta,
        "max_loss_delta": report.max_loss_delta,
        "max_mutation_delta": report.max_mutation_delta,
        "control_detected": report.control_detected,
        "control_min_delta": report.control_min_delta,
        "control_max_delta": report.control_max_delta,
        "loss_true": report.loss_true,
        "loss_naive": report.loss_naive,
        "notes": list(report.notes),
        "findings": findings.count("model"),
    }
    return detail, report
