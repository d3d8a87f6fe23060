"""The array idioms every stage shares, written once.

Examples, segments and rows are all *ranges* of a flat array, given by offsets
``[0, end_0, end_1, …]`` (``offsets[i]:offsets[i + 1]`` is range ``i``)::

    lengths        [3, 2, 4]
    offsets        [0, 3, 5, 9]          exclusive_cumsum(lengths)
    labels         [- a a | - b | - c c -]   ('-' = IGNORE_INDEX)
    range_sums     trained per range: [2, 1, 2]
    count_trained  the same without each range's first label: [2, 1, 2]

``count_trained`` is the loss-token count everywhere in packshard (ingest, the spill, the
planner's rows, the shards, verify, the reader): once packed, the first label of every segment
is masked at its seam, so a target in that place never trains.  Capacity figures use one
definition too: ``fill_rate`` is tokens over ``rows × max_seq_len`` (0.0 with no rows) and
``lower_bound_rows`` is ``⌈tokens / max_seq_len⌉``.  Names (sources, domains, formats) travel
as small integer codes (:class:`NameCodes`), and their counts as arrays (:func:`add_counts`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from packshard.records import IGNORE_INDEX


def exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    """Return ``[0, v0, v0+v1, …]`` (length ``len(values) + 1``, int64)."""
    out = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=out[1:])
    return out


def range_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Return the sum of ``values`` over every range ``offsets[i]:offsets[i + 1]`` (int64)."""
    running = exclusive_cumsum(values)
    return running[offsets[1:]] - running[offsets[:-1]]


def count_trained(labels: np.ndarray, offsets: np.ndarray, skip_first: bool = True) -> np.ndarray:
    """Return per range the labels ``!= IGNORE_INDEX``, each range's first excluded (int64).

    ``skip_first=False`` counts every trained label (for rows, whose segment starts are
    already masked).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    trained = labels != IGNORE_INDEX
    counts = range_sums(trained, offsets)
    if skip_first:
        starts = offsets[:-1]
        nonempty = offsets[1:] > starts
        counts[nonempty] -= trained[starts[nonempty]]
    return counts


def fill_rate(tokens: int, rows: int, max_seq_len: int) -> float:
    """Return ``tokens / (rows × max_seq_len)``, a fraction; 0.0 when there are no rows."""
    return tokens / (rows * max_seq_len) if rows else 0.0


def lower_bound_rows(tokens: int, max_seq_len: int) -> int:
    """Return ``⌈tokens / max_seq_len⌉``: no packing of ``tokens`` uses fewer rows."""
    return -(-int(tokens) // int(max_seq_len))


def add_counts(total: np.ndarray, more: np.ndarray) -> np.ndarray:
    """Add two count arrays, the shorter one padded with zeros."""
    out = np.zeros(max(len(total), len(more)), dtype=np.int64)
    out[: len(total)] += total
    out[: len(more)] += more
    return out


class NameCodes:
    """Small integer codes for names, in order of first appearance."""

    def __init__(self, names: tuple[str, ...] = ()) -> None:
        self.names = list(names)
        self._code = {name: i for i, name in enumerate(self.names)}

    def encode(self, names: Sequence[str]) -> np.ndarray:
        """Return the code of each name (int32), giving new names the next codes."""
        code = self._code
        for name in names:
            if name not in code:
                code[name] = len(self.names)
                self.names.append(name)
        return np.fromiter((code[n] for n in names), dtype=np.int32, count=len(names))
