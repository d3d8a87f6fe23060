"""``--dp``: the train rows ordered into global steps whose slowest rank is close to the mean.

A step of ``S = dp × k`` rows (``k = micro_batch × grad_accum`` rows a rank) costs the time of
its most expensive rank.  Rows in the seed's shuffled order put a long row and a short one in
the same step by chance; the balanced order (:func:`balanced_order`), all vectorised over steps:

1. sort the rows by cost, most expensive first (ties in the seed's order), and cut that list
   into steps of ``S`` consecutive rows: a step's rows cost about the same;
2. deal each step's rows in ``k`` rounds of ``dp``: round ``j`` gives its most expensive row to
   the rank with the least cost so far, the next to the next least, … (longest-processing-time
   first, with every rank taking exactly ``k`` rows);
3. shuffle the steps with the seed (training never sees the rows sorted by length), and lay
   each step out as the reader deals it, row ``j·dp + r`` to rank ``r``.

For ``dp = 2``, ``k = 2`` and one step of costs ``9 7 4 2``: round 0 gives 9 to rank 0 and 7 to
rank 1; round 1 gives 4 to rank 1 (7 < 9) and 2 to rank 0: ranks cost 11 and 11, max/mean 1.00
(the seed's order ``9 4 | 7 2`` costs 13 and 9, max/mean 1.18).

The rows after the last whole step (fewer than ``S``, the cheapest) come last; the eval rows
keep their shuffled order after the train rows.  The figures (:func:`balance_stats`) are
``Σ_steps max / Σ_steps mean`` and the worst step, for this order and for the seed's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packshard.format.topology import Topology, row_costs, step_balance
from packshard.pack.plan.rows import RowPlan


def plan_costs(plan: RowPlan, topology: Topology) -> np.ndarray:
    """Return each row's cost by the topology's cost rule."""
    return row_costs(plan.seg_length, plan.row_offsets, topology.cost, topology.c)


def balanced_order(costs: np.ndarray, topology: Topology, seed: int) -> np.ndarray:
    """Return the row order (a permutation of ``0 … len(costs)-1``) of balanced steps."""
    dp, k, size = topology.dp, topology.rows_per_rank, topology.step_rows
    n = len(costs)
    steps = n // size
    by_cost = np.argsort(-costs, kind="stable")
    whole, tail = by_cost[: steps * size], by_cost[steps * size :]
    if steps == 0:
        return tail.astype(np.int64)
    rows = whole.reshape(steps, k, dp)  # step, round, rank-slot: each round's rows descending
    load = np.zeros((steps, dp), np.float64)
    placed = np.empty((steps, k, dp), np.int64)
    step_index = np.arange(steps)[:, None]
    for j in range(k):
        lightest = np.argsort(load, axis=1, kind="stable")  # ranks, least loaded first
        placed[step_index, j, lightest] = rows[:, j, :]
        load[step_index, lightest] += costs[rows[:, j, :]]
    shuffled = np.random.default_rng(seed).permutation(steps)
    return np.concatenate([placed[shuffled].reshape(-1), tail]).astype(np.int64)


def balance_stats(costs: np.ndarray, order: np.ndarray, topology: Topology) -> dict[str, Any]:
    """Return the manifest's ``stats.balance``: this order's figures beside the given one's.

    ``costs`` are the rows in the seed's order; ``order`` the balanced permutation of them.
    """
    balanced, plain = step_balance(costs[order], topology), step_balance(costs, topology)
    return {
        **topology.recorded(),
        "steps": balanced["steps"],
        "partial_rows": balanced["partial_rows"],
        "max_over_mean": balanced["max_over_mean"],
        "worst_step": balanced["worst_step"],
        "unbalanced_max_over_mean": plain["max_over_mean"],
        "unbalanced_worst_step": plain["worst_step"],
    }
