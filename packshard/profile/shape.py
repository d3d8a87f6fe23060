"""The packed rows' shape before packing: row fill spread and trained tokens per step.

``profile`` plans the rows as ``pack`` would (``plan_packs(clipped, L, "bfd")``, the same
planner :mod:`packshard.profile.lengths` measures utilization with) and reports what the
manifest will (:mod:`packshard.pack.plan.shape`): min/p10/median/p90/max of each row's fill
(tokens / ``max_seq_len``) and of the trained tokens in an optimizer step of ``--batch-size``
consecutive rows (full steps only).  An overlong example counts as clipped to ``L`` tokens,
with at most ``L − 1`` of them trained (``--overlong truncate``; ``drop`` would remove it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from packshard.pack.plan.shape import row_shape, step_loss_tokens


def packed_shape(
    lengths: np.ndarray, loss_tokens: np.ndarray, max_seq_len: int, batch_size: int
) -> dict[str, Any]:
    """Return ``row_fill`` and ``step_loss_tokens`` of the rows ``pack`` would plan."""
    from packshard.pack.plan.planner import plan_packs

    clipped = np.minimum(lengths, max_seq_len).astype(np.int64)
    keep = clipped > 0
    trained = np.minimum(loss_tokens, np.maximum(clipped - 1, 0))[keep]
    plan = plan_packs(clipped[keep], max_seq_len, "bfd")
    fill, rows = row_shape(replace(plan, seg_targets=trained[plan.seg_example]))
    steps = {"rows_per_step": batch_size, **step_loss_tokens(rows, batch_size)}
    return {"row_fill": fill, "step_loss_tokens": steps}


def describe_shape(shape: dict[str, Any]) -> str:
    """Return the shape as one line of the text report ('' when nothing would be packed)."""
    fill, steps = shape.get("row_fill", {}), shape.get("step_loss_tokens", {})
    if not fill or not fill.get("max"):
        return ""
    spread = " / ".join(f"{100 * fill[k]:.1f}%" for k in ("min", "p10", "median", "p90", "max"))
    line = f"row fill min / p10 / median / p90 / max: {spread}"
    if steps.get("steps"):
        counts = " / ".join(f"{steps[k]:,}" for k in ("min", "median", "max"))
        line += (
            f"; trained tokens per step of {steps['rows_per_step']} rows min / median / max: "
            f"{counts} (normalise by num_items_in_step)"
        )
    return line
