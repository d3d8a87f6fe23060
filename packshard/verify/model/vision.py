r"""The vision stage of ``verify``: images re-hashed, and a tiny Qwen2.5-VL on packed rows.

A pack with images (its index has a ``media`` column) gets one more check, ``vision``:

1. every image the index names is read again, its size and SHA-256 compared with the
   recorded ones; a missing or changed file is a finding at its example's ``source:line``;
2. sampled rows with several segments are served by
   :class:`~packshard.torch.vision.rows.PackedVisionDataset` (pixels, grids, four-row
   positions) and compared with each segment alone through a tiny random Qwen2.5-VL
   (:func:`~packshard.torch.vision.tiny.compare_row`): max |Δlogit| must stay within
   ``atol``, and each of the three wrong position forms (one row, three rows without the
   text row, not restarted) must move at least 95% of those rows by ``CONTROL_FLOOR``, or
   the check could not have failed and says so::

       rows 2 (2 with several segments, 7 images)   packed vs alone 3.6e-07
       controls: one row 2/2, three rows 2/2, not restarted 2/2 moved >= 1e-2

Without torch and transformers the model half is reported as not run, never as passed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from packshard.errors import FormatError
from packshard.format.examples import EXAMPLES_NAME
from packshard.verify.findings import CheckResult, Finding, FindingList
from packshard.verify.model.equivalence import DEFAULT_ATOL

CONTROL_FLOOR = 1e-2
"""How far each wrong position form must move a multi-segment row's logits."""
CONTROLS = ("one_row", "three_rows", "not_restarted")
CONTROL_SHARE = 0.95
"""The least share of multi-segment rows each wrong position form must move."""


def _rehash(folder: Path, findings: FindingList) -> int:
    """Read every recorded image again; return how many distinct files were checked."""
    from packshard.torch.vision.rows import read_media

    table = pq.read_table(folder / EXAMPLES_NAME, columns=["example_id", "source", "line", "media"])
    seen: dict[tuple[str, str], bool] = {}
    for eid, source, line, media in zip(
        *(table[c].to_pylist() for c in ("example_id", "source", "line", "media")), strict=True
    ):
        for entry in media or ():
            key = (entry["root"], entry["path"])
            if key in seen:
                continue
            try:
                read_media(entry, None, f"example {eid}")
                seen[key] = True
            except FormatError as exc:
                seen[key] = False
                findings.add(Finding("vision", str(exc), example_id=eid, source=f"{source}:{line}"))
    return len(seen)


def check_vision(folder: Path, options: Any) -> CheckResult:
    """Run the vision stage on a pack with images (see the module docstring)."""
    findings = FindingList()
    files = _rehash(folder, findings)
    detail: dict[str, Any] = {"images_checked": files}
    if options.model == "none":
        return CheckResult("vision", findings, detail)
    missing = [m for m in ("torch", "transformers", "PIL") if importlib.util.find_spec(m) is None]
    if missing:
        why = f"the vision stage needs {', '.join(missing)}: pip install 'packshard[torch]'"
        return CheckResult("vision", findings, detail, not_run=why)
    if len(findings):
        return CheckResult("vision", findings, detail)
    from packshard.torch.vision.rows import PackedVisionDataset
    from packshard.torch.vision.tiny import compare_row, tiny_qwen25_vl

    rows = PackedVisionDataset(folder, split=None)
    model = tiny_qwen25_vl(patch_size=rows.rule.patch_size)
    picked = [i for i in range(len(rows)) if len(rows.rows[i]["cu_seqlens"]) > 2]
    picked = picked[: options.model_rows]
    worst, moved, images = 0.0, dict.fromkeys(CONTROLS, 0), 0
    for i in picked:
        row = rows[i]
        images += 0 if "image_grid_thw" not in row else len(row["image_grid_thw"])
        got = compare_row(model, row)
        worst = max(worst, got["packed"])
        if got["packed"] > DEFAULT_ATOL:
            findings.add(
                Finding(
                    "vision",
                    f"packed vs alone max |Δlogit| {got['packed']:.3g} > atol {DEFAULT_ATOL:g}",
                    row=i,
                )
            )
        for name in CONTROLS:
            moved[name] += got[name] >= CONTROL_FLOOR
    for name in CONTROLS:
        if picked and moved[name] < CONTROL_SHARE * len(picked):
            findings.add(
                Finding(
                    "vision",
                    f"control {name} moved only {moved[name]} of {len(picked)} rows by "
                    f">= {CONTROL_FLOOR:g}: this check could not have failed",
                )
            )
    detail.update(
        rows=len(picked),
        images=images,
        max_logit_delta=worst,
        atol=DEFAULT_ATOL,
        controls_moved={k: int(v) for k, v in moved.items()},
    )
    if not picked:
        return CheckResult(
            "vision", findings, detail, not_run="no row with several segments to compare"
        )
    return CheckResult("vision", findings, detail)
