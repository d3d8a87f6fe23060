"""Rank-balanced steps: the topology a pack's row order was balanced for, and its cost.

A data-parallel step waits for its slowest rank.  ``pack --dp 8 --micro-batch 1 --grad-accum 4``
orders the train rows into global steps of ``dp × micro_batch × grad_accum`` = 32 rows laid out
as the reader deals them (row ``i`` of a step to rank ``i mod dp``, as ``rows[r::dp]``)::

    step s           rows  32·s … 32·s+31
    rank r           rows  32·s + r, 32·s + 8 + r, 32·s + 16 + r, 32·s + 24 + r

and :mod:`packshard.pack.plan.balance` chooses which rows share a step and which rank gets
each, so that every rank's cost in a step is close to the step's mean.  The cost of a row is
that of its segments (lengths ``n``), by ``--balance-cost``:

    tokens       Σ n
    attention    Σ n + c·Σ n²        c = 1 / (12 · 4096) by default (``--attention-c``)

The default ``c`` is a transformer layer's FLOPs for hidden size 4096 (dense matrices about
24·h² a token, attention about 2·h·n: 24·h²·(n + n²/(12·h)) a segment).  The manifest records
``Σ_steps max_rank / Σ_steps mean_rank`` (1.0: no time lost) and the worst step, beside the
same figures for the seed's order.

The reader (:mod:`packshard.torch.stream`) keeps the balance for the recorded ``dp`` by
shuffling whole steps; with another world size it warns and shuffles rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from packshard.errors import UsageError

ATTENTION_C = 1 / (12 * 4096)
BALANCE_COSTS = ("tokens", "attention")
MAX_DP = 1 << 20


@dataclass(frozen=True, slots=True)
class Topology:
    """The data-parallel shape a pack's steps were balanced for (manifest ``config.topology``)."""

    dp: int
    micro_batch: int = 1
    grad_accum: int = 1
    cost: str = "attention"
    c: float = ATTENTION_C

    def __post_init__(self) -> None:
        for flag, value in (
            ("--dp", self.dp),
            ("--micro-batch", self.micro_batch),
            ("--grad-accum", self.grad_accum),
        ):
            if type(value) is not int or not 1 <= value <= MAX_DP:
                raise UsageError(f"{flag} must be an integer in [1, {MAX_DP}], got {value!r}")
        if self.cost not in BALANCE_COSTS:
            raise UsageError(f"--balance-cost must be one of {', '.join(BALANCE_COSTS)}")
        if not 0 <= self.c < 1:
            raise UsageError(f"--attention-c must be in [0, 1), got {self.c!r}")

    @property
    def rows_per_rank(self) -> int:
        """Rows one rank reads in a step: ``micro_batch × grad_accum``."""
        return self.micro_batch * self.grad_accum

    @property
    def step_rows(self) -> int:
        """Rows in one global step: ``dp × micro_batch × grad_accum``."""
        return self.dp * self.rows_per_rank

    def recorded(self) -> dict[str, Any]:
        """Return the manifest's ``config.topology``."""
        return {
            "dp": self.dp,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "cost": self.cost,
            "c": self.c if self.cost == "attention" else 0.0,
        }

    @staticmethod
    def from_config(config: dict[str, Any]) -> Topology | None:
        """Return a manifest ``config``'s topology, or None for a pack not balanced."""
        entry = config.get("topology")
        if not entry:
            return None
        return Topology(
            int(entry["dp"]),
            int(entry["micro_batch"]),
            int(entry["grad_accum"]),
            str(entry["cost"]),
            float(entry["c"]),
        )


def row_costs(
    seg_lengths: np.ndarray, row_offsets: np.ndarray, cost: str, c: float = ATTENTION_C
) -> np.ndarray:
    """Return each row's cost (float64): Σn, or Σn + c·Σn² for ``attention``."""
    n = np.asarray(seg_lengths, dtype=np.float64)
    per_seg = n + c * n * n if cost == "attention" else n
    rows = len(row_offsets) - 1
    if rows == 0:
        return np.zeros(0, np.float64)
    sums = np.add.reduceat(per_seg, np.asarray(row_offsets[:-1], dtype=np.int64))
    empty = np.diff(row_offsets) == 0
    sums[empty] = 0.0  # reduceat gives the next row's first value for an empty row
    return sums


def step_balance(costs: np.ndarray, topology: Topology) -> dict[str, float | int]:
    """Return the rank balance of rows in this order: whole steps, max over mean.

    ``max_over_mean`` is ``Σ_steps max_rank / Σ_steps mean_rank``; ``worst_step`` the largest
    single step's max/mean; ``steps`` the whole steps counted, ``partial_rows`` the rows after them.
    """
    size, dp = topology.step_rows, topology.dp
    steps = len(costs) // size
    if steps == 0:
        return {"steps": 0, "partial_rows": len(costs), "max_over_mean": 1.0, "worst_step": 1.0}
    per_rank = costs[: steps * size].reshape(steps, topology.rows_per_rank, dp).sum(axis=1)
    top, mean = per_rank.max(axis=1), per_rank.mean(axis=1)
    ratio = np.divide(top, mean, out=np.ones_like(top), where=mean > 0)
    return {
        "steps": int(steps),
        "partial_rows": int(len(costs) - steps * size),
        "max_over_mean": round(float(top.sum() / mean.sum()) if mean.sum() else 1.0, 6),
        "worst_step": round(float(ratio.max()), 6),
    }


def step_permutation(num_rows: int, step_rows: int, rng: np.random.Generator) -> np.ndarray:
    """Return a row permutation that moves whole steps of ``step_rows`` rows, never a row.

    The rows after the last whole step stay last, in their order.
    """
    steps = num_rows // step_rows
    order = rng.permutation(steps)
    whole = (order[:, None] * step_rows + np.arange(step_rows)).reshape(-1)
    return np.concatenate([whole, np.arange(steps * step_rows, num_rows)]).astype(np.int64)
