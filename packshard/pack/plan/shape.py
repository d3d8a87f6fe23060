"""The shape of the packed rows: how full they are, and what one optimizer step trains.

A mean fill rate hides the tail (each short row is a short micro-batch), so the manifest
records the distribution of row fill (nearest-rank quantiles) and of the trained tokens per
optimizer step of ``R`` consecutive rows (``R = batch_size × grad_accum × world_size``)::

    row loss tokens   40 12 35 38 | 9 41 30 33 | 36 …      R = 4
    per step          125         | 113        | …       min / median / max over full steps

The reader shuffles rows per epoch, so its steps are other draws of the same rows: the spread
is what matters.  Only full steps are counted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packshard.pack.plan.rows import RowPlan

ROWS_PER_STEP = (1, 8, 64)
"""Step sizes (rows per optimizer step, all ranks) the manifest describes."""

QUANTILES = (("min", 0), ("p10", 10), ("median", 50), ("p90", 90), ("max", 100))


def quantiles(values: np.ndarray) -> dict[str, float]:
    """Return min, p10, median, p90 and max of ``values`` (nearest-rank; zeros when empty)."""
    if values.size == 0:
        return {name: 0.0 for name, _ in QUANTILES}
    found = np.percentile(values, [q for _, q in QUANTILES], method="inverted_cdf")
    return {name: float(v) for (name, _), v in zip(QUANTILES, found, strict=True)}


def step_loss_tokens(row_loss: np.ndarray, rows_per_step: int) -> dict[str, Any]:
    """Return the trained tokens of each full step of ``rows_per_step`` consecutive rows."""
    steps = row_loss.shape[0] // rows_per_step
    sums = row_loss[: steps * rows_per_step].reshape(steps, rows_per_step).sum(axis=1)
    return {"steps": int(steps), **{k: int(v) for k, v in quantiles(sums).items()}}


def row_shape(plan: RowPlan) -> tuple[dict[str, float], np.ndarray]:
    """Return the quantiles of ``plan``'s row fill (rounded) and each row's trained tokens."""
    fill = plan.row_tokens() / max(plan.max_seq_len, 1)
    row_loss = plan.row_sums(plan.seg_targets)
    return {k: round(v, 6) for k, v in quantiles(fill).items()}, row_loss


def pack_shape(plan: RowPlan) -> dict[str, Any]:
    """Return the manifest's ``row_fill`` and ``step_loss_tokens`` stats of ``plan``."""
    fill, row_loss = row_shape(plan)
    steps = {str(r): step_loss_tokens(row_loss, r) for r in ROWS_PER_STEP}
    return {"row_fill": fill, "step_loss_tokens": steps}
