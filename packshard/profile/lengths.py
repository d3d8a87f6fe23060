"""Length statistics and the cost of padding, bucketing and packing, from lengths alone.

Conventions (the report states them too):

* Percentiles are nearest-rank: P<p> is the smallest length such that at least p% of the
  examples are that long or shorter, i.e. ``sorted[ceil(p·n/100) − 1]`` (numpy's
  ``method="inverted_cdf"``).  Every percentile is an observed length.
* Every strategy sees lengths clipped to ``max_seq_len``: an overlong example counts as
  truncated.  Useful tokens are therefore the same ``U = Σ min(len, L)`` for all four
  strategies; only the computed tokens differ.  Useful fraction = U / computed.

Worked example, lengths ``[5, 2, 1]``, ``L = 8``, ``batch_size = 3`` (U = 8)::

    pad_to_max      5 2 1 → 3 rows × 8           = 24 computed   8/24 = 33%
    random_batches  one batch, longest 5 → 3 × 5  = 15 computed   8/15 = 53%
    bucketed        sorted [1 2 5], same batch    = 15 computed   8/15 = 53%
    packed (bfd)    |55555221| one row × 8        =  8 computed   8/8 = 100%

Batches hold ``batch_size`` consecutive examples; the last one may be smaller and is not
filled with padding examples.  Random batches follow
``numpy.random.default_rng(seed).permutation(n)``; bucketed batches follow ``np.sort``
(ascending).  Packing is
``plan_packs(clipped, L, "bfd")`` — the planner ``pack`` uses — and its lower bound is
⌈U / L⌉ rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packshard.arrays import lower_bound_rows

PERCENTILES = (50, 90, 95, 99)
PERCENTILE_METHOD = "nearest-rank (numpy inverted_cdf)"
STRATEGIES = ("pad_to_max", "random_batches", "bucketed", "packed")
HISTOGRAM_BINS_PER_OCTAVE = 4
"""Histogram edges are ``floor(2**(k/4))`` (deduplicated): about 4 bins per doubling."""


@dataclass(frozen=True, slots=True)
class LengthStats:
    """Nearest-rank percentiles, maximum and mean of example lengths in tokens."""

    p50: int
    p90: int
    p95: int
    p99: int
    max: int
    mean: float


@dataclass(frozen=True, slots=True)
class Utilization:
    """Tokens carrying data (``useful``) versus tokens a model computes under one strategy."""

    strategy: str
    rows: int
    computed_tokens: int
    useful_tokens: int

    @property
    def fraction(self) -> float:
        """Useful tokens / computed tokens (0.0 when nothing is computed)."""
        return self.useful_tokens / self.computed_tokens if self.computed_tokens else 0.0


def compute_histogram_edges(longest: int, max_seq_len: int) -> np.ndarray:
    """Return integer bin edges ``[1, 2, 3, 4, 5, 6, 8, 9, 11, 13, 16, …]`` past ``longest``.

    ``max_seq_len + 1`` is always an edge, so no bin mixes fitting and overlong examples.
    """
    top = int(np.ceil(HISTOGRAM_BINS_PER_OCTAVE * np.log2(max(longest, 1) + 1))) + 1
    edges = np.floor(2.0 ** (np.arange(top + 1) / HISTOGRAM_BINS_PER_OCTAVE))
    return np.unique(np.append(edges, max_seq_len + 1)).astype(np.int64)


def nearest_rank(sorted_lengths: np.ndarray, percent: int) -> int:
    """Return the ``percent`` nearest-rank percentile of an ascending, non-empty array.

    The value at rank ``ceil(percent · n / 100)``, computed in integers: the smallest length
    that ``percent``% of the examples do not exceed.
    """
    n = sorted_lengths.shape[0]
    return int(sorted_lengths[max((percent * n + 99) // 100, 1) - 1])


def measure_lengths(sorted_lengths: np.ndarray) -> LengthStats:
    """Return nearest-rank percentiles of an ascending, non-empty length array."""
    p50, p90, p95, p99 = (nearest_rank(sorted_lengths, p) for p in PERCENTILES)
    return LengthStats(p50, p90, p95, p99, int(sorted_lengths[-1]), float(sorted_lengths.mean()))


def measure_batches(ordered: np.ndarray, batch_size: int) -> int:
    """Return tokens computed when ``ordered`` is cut into batches padded to their longest."""
    n = ordered.shape[0]
    full = n // batch_size * batch_size
    computed = int(ordered[:full].reshape(-1, batch_size).max(axis=1).sum()) * batch_size
    if full < n:
        computed += int(ordered[full:].max()) * (n - full)
    return computed


def measure_utilization(
    lengths: np.ndarray, max_seq_len: int, batch_size: int, seed: int
) -> tuple[tuple[Utilization, ...], int]:
    """Return the four strategies' utilization and the packing lower bound for ``lengths``."""
    from packshard.pack.plan.planner import plan_packs

    clipped = np.minimum(lengths, max_seq_len).astype(np.int64)
    n, useful = clipped.shape[0], int(clipped.sum())
    if n == 0:
        return (), 0
    shuffled = clipped[np.random.default_rng(seed).permutation(n)]
    rows = plan_packs(clipped[clipped > 0], max_seq_len, "bfd").num_rows  # needs 1..L
    return (
        Utilization("pad_to_max", n, n * max_seq_len, useful),
        Utilization("random_batches", n, measure_batches(shuffled, batch_size), useful),
        Utilization("bucketed", n, measure_batches(np.sort(clipped), batch_size), useful),
        Utilization("packed", rows, rows * max_seq_len, useful),
    ), lower_bound_rows(useful, max_seq_len)
