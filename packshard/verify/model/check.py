"""The model stage of ``verify``: sampled rows through the tiny model, findings pinned to them.

Picks rows (:func:`~packshard.verify.model.forward.pick_rows`), pads them where the pack is
aligned (:func:`served_row`), crops them, runs
:func:`~packshard.verify.model.equivalence.check_rows` (on a preference pack also the pairs,
:mod:`packshard.verify.model.pairs`) and pins its issues to ``shard/row/segment`` and
``file:line``.  Without torch and transformers the stage is not run, never passed.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pyarrow as pa

from packshard.format.examples import ExamplesIndex
from packshard.format.shards import read_row
from packshard.format.topology import PADDED_COLUMN, padded_row
from packshard.records import PackedRow
from packshard.verify.findings import CheckResult, EquivalenceReport, Finding, FindingList
from packshard.verify.model.equivalence import CONTROL_FLOOR, check_rows
from packshard.verify.model.forward import boundary_control, crop_row, load_model, pick_rows


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        return False


def pair_branches(table: pa.Table, row: int) -> np.ndarray | None:
    """Return row ``row``'s per-segment ``branch`` column, or None in a pack without pairs."""
    if "branch" not in table.column_names:
        return None
    return np.asarray(table["branch"][row].values.to_numpy(zero_copy_only=False), np.int64)


def served_row(manifest: dict[str, Any], table: pa.Table, row: int) -> PackedRow:
    """Return row ``row`` as the reader serves it: with its pads in an aligned pack.

    An aligned pack's segments are run padded (:func:`~packshard.format.topology.padded_row`,
    pads of the EOS id after each segment's tokens), so the proof covers what a
    context-parallel trainer computes: pads change no real token's logits.
    """
    packed = read_row(table, row)
    if PADDED_COLUMN not in table.column_names:
        return packed
    padded = np.asarray(table[PADDED_COLUMN][row].values.to_numpy(zero_copy_only=False))
    pad_id = int(manifest.get("tokenizer", {}).get("eos_token_id") or 0)
    return padded_row(packed, padded, pad_id)[0]


def check_model(
    manifest: dict[str, Any],
    tables: dict[int, pa.Table],
    index: ExamplesIndex | None,
    options: Any,
    broken: dict[int, np.ndarray] | None = None,
) -> tuple[CheckResult, EquivalenceReport | None, list[tuple[int, int]]]:
    """Run the proof on sampled rows: the check's result, the report and the rows picked.

    Rows in ``broken`` (the structural audit's findings) are left out: the proof needs rows
    whose boundaries are sound.
    """
    missing = [m for m in ("torch", "transformers") if not _installed(m)]
    if missing and options.model != "none":
        why = (
            f"the model stage needs {' and '.join(missing)}: pip install 'packshard[torch]' "
            "(or pass --model none to skip it)"
        )
        return CheckResult("model", not_run=why), None, []
    picks = pick_rows(tables, options.model_rows, options.seed, broken)
    if not picks:
        return CheckResult("model", not_run="no sound rows to check"), None, []
    branches = [pair_branches(tables[s], r) for s, r in picks]
    rows = [
        crop_row(served_row(manifest, tables[s], r), options.model_max_tokens, b)
        for (s, r), b in zip(picks, branches, strict=True)
    ]
    paths = [manifest["shards"][s]["path"] for s, _ in picks]
    recorded = int(manifest.get("tokenizer", {}).get("vocab_size", 0) or 0)
    largest = max((int(r.input_ids.max()) for r in rows if r.num_tokens), default=0)
    model = load_model(
        options.model, max(recorded, largest + 1, 2), seed=options.seed, config=options.model_config
    )
    names = [f"{path} row {r}" for path, (_, r) in zip(paths, picks, strict=True)]
    report = check_rows(model, rows, names=names, seed=options.seed, branches=branches)
    findings = FindingList()
    for issue in report.issues:
        if issue.row < 0:
            findings.add(Finding("model", issue.message), issue.kind)
            continue
        row, path = rows[issue.row], paths[issue.row]
        seg = issue.segment
        eid = int(row.example_ids[seg]) if seg is not None and seg < len(row.example_ids) else None
        source = index.where(eid) if index is not None and eid is not None else None
        findings.add(
            Finding("model", issue.message, path, picks[issue.row][1], seg, eid, source),
            issue.kind,
        )
    if not report.control_detected and any(r.control_delta is not None for r in report.rows):
        findings.add(Finding("model", "the naive-mask control was not detected: verify is broken"))
    detail: dict[str, Any] = {
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
    }
    if report.pair_summary is not None:
        detail["pairs"] = report.pair_summary
    detail.update(_layer_detail(model, rows, findings))
    return CheckResult("model", findings, detail), report, picks


def _layer_detail(model: Any, rows: list[Any], findings: FindingList) -> dict[str, Any]:
    """Return the layer kinds checked and, for a hybrid, the control that withholds the seams.

    Every recurrent, state-space or convolutional layer of the model must be seen leaking
    when its seams are withheld, on the first multi-segment row: else the check could not
    tell a leak in those layers from none, and that is a finding.
    """
    from packshard.torch.layers.kinds import STATEFUL, kind_counts, model_layers

    layers = model_layers(model)
    detail: dict[str, Any] = {
        "architecture": type(model).__name__,
        "layer_kinds": kind_counts(layers),
    }
    stateful = sorted({layer.cls for layer in layers if layer.kind in STATEFUL})
    multi = [row for row in rows if len(row.cu_seqlens) > 2]
    if not stateful or not multi:
        return detail
    delta, where = boundary_control(model, multi[0])
    detail["boundary_control"] = {"layers": stateful, "max_logit_delta": delta, "first": where}
    if not delta > CONTROL_FLOOR:
        findings.add(
            Finding(
                "model",
                f"withholding the seams from {', '.join(stateful)} moved logits by only "
                f"{delta:.1e} <= {CONTROL_FLOOR:.0e}: the check cannot see a leak in those layers",
            )
        )
    return detail
