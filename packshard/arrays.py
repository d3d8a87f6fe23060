"""The array idioms every stage shares, written once.

Examples, segments and rows are all *ranges* of a flat array, given by offsets
``[0, end_0, end_1, …]`` (``offsets[i]:offsets[i + 1]`` is range ``i``)::

    lengths        [3, 2, 4]
    offsets        [0, 3, 5, 9]          exclusive_cumsum(lengths)
    labels         [- a a | - b | - c c -]   ('-' = IGNORE_INDEX)
    count_trained  trained per range, its first label left out: [2, 1, 2]

``count_trained`` is the loss-token count everywhere in packshard (ingest, the spill, the
planner's rows, the shards, verify, the reader): once packed, the first label of every segment
is masked at its seam, so a target in that place never trains.  It finds the positions of
the rarer kind of label and counts them per range by binary search, with no summed copy of
the flags (``docs/performance.md``, "Counting trained labels").

``IGNORE_INDEX`` is defined here, with the one function that counts around it, so that this
module is a leaf; :mod:`packshard.records` names it again for every stage.

Capacity figures use one definition too: ``fill_rate`` is tokens over ``rows ×
max_seq_len`` (0.0 with no rows) and ``lower_bound_rows`` is ``⌈tokens / max_seq_len⌉``.
Names (sources, domains, formats) travel as small integer codes (:class:`NameCodes`), and
their counts as arrays (:func:`add_counts`).

Arrow columns are made from numpy buffers (:func:`arrow_array`, :func:`arrow_strings`) rather
than by ``pa.array``, which imports pandas (about 0.2 CPU-s of every ``pack`` process) to ask
whether its argument is a categorical.  The arrays, hence the Parquet bytes, are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

IGNORE_INDEX = -100
"""Label value meaning "no loss here" (the Hugging Face / PyTorch convention)."""


def exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    """Return ``[0, v0, v0+v1, …]`` (length ``len(values) + 1``, int64)."""
    out = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=out[1:])
    return out


def count_trained(labels: np.ndarray, offsets: np.ndarray, skip_first: bool = True) -> np.ndarray:
    """Return per range the labels ``!= IGNORE_INDEX``, each range's first excluded (int64).

    ``skip_first=False`` counts every trained label (for rows, whose segment starts are
    already masked).  The rarer kind, trained or not, is counted by where it is (its
    positions, searched for each range's ends): no copy of the flags in a wider type.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    counts = np.zeros(max(len(offsets) - 1, 0), dtype=np.int64)
    if len(offsets) < 2:
        return counts
    lo = int(offsets[0])
    trained = labels[lo : int(offsets[-1])] != IGNORE_INDEX
    ends = offsets - lo
    rare = 2 * int(np.count_nonzero(trained)) <= len(trained)
    where = np.flatnonzero(trained if rare else ~trained)
    found = np.searchsorted(where, ends[1:]) - np.searchsorted(where, ends[:-1])
    counts[:] = found if rare else np.diff(ends) - found
    if skip_first:
        starts = ends[:-1]
        nonempty = ends[1:] > starts
        counts[nonempty] -= trained[starts[nonempty]]
    return counts


def invert(order: np.ndarray) -> np.ndarray:
    """Return the inverse of the permutation ``order`` of ``0 … n-1`` (int32 while n fits)."""
    n = len(order)
    inverse = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
    inverse[order] = np.arange(n, dtype=inverse.dtype)
    return inverse


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
        """Return the code of each name (int32), giving new names the next codes.

        One name throughout (a batch of one input, one domain, one format: the usual case)
        is one lookup: 5.6 µs for 1,024 names against 66 by name.
        """
        code = self._code
        same = bool(names) and names.count(names[0]) == len(names)
        for name in names[:1] if same else names:
            if name not in code:
                code[name] = len(self.names)
                self.names.append(name)
        if same:
            return np.full(len(names), code[names[0]], dtype=np.int32)
        return np.fromiter((code[n] for n in names), dtype=np.int32, count=len(names))


def arrow_array(values: np.ndarray, kind: pa.DataType | None = None) -> pa.Array:
    """Return ``pa.array(values, kind)`` for a 1-D numeric or bool array, without pandas.

    The array is built on ``values``' buffer (a copy when it is not contiguous); ``kind``,
    when it differs from the numpy type, is reached by Arrow's safe cast, as ``pa.array``
    does (an int64 value that does not fit int32 raises).
    """
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    if values.ndim != 1:
        raise ValueError(f"arrow_array takes a 1-D array, not {values.ndim}-D")
    if kind is not None and pa.types.is_integer(kind) and values.dtype.kind in "iu":
        target = np.dtype(str(kind))  # an integer to an integer: numpy's copy, no compute
        if target != values.dtype:
            low, high = np.iinfo(target).min, np.iinfo(target).max
            if values.size and (int(values.min()) < low or int(values.max()) > high):
                raise pa.ArrowInvalid(f"Integer value out of range for {kind}: {low} to {high}")
            values = values.astype(target)
    if values.dtype == np.bool_:
        data = np.packbits(values, bitorder="little")
        out = pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(data)])
    else:
        native = pa.from_numpy_dtype(values.dtype)
        out = pa.Array.from_buffers(native, len(values), [None, pa.py_buffer(values)])
    return out if kind is None or out.type == kind else out.cast(kind)


def utf8_batch(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Return the texts' UTF-8 bytes, concatenated, and the byte offset of each (int64)."""
    encoded = [t.encode("utf-8") for t in texts]
    offsets = exclusive_cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets


def arrow_strings(names: Sequence[str]) -> pa.Array:
    """Return ``pa.array(names, pa.string())`` for a list of strings, without pandas."""
    import pyarrow as pa

    data, offsets = utf8_batch(names)
    buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), len(names), buffers)


CODED_WIDTH = 256
"""Longest name (bytes) that :func:`arrow_coded_strings` gathers as fixed-width rows."""


def arrow_coded_strings(codes: np.ndarray, names: Sequence[str]) -> pa.Array:
    """Return ``names[codes[i]]`` for every i as an Arrow string array, built from buffers.

    The same array as a dictionary array cast to strings, without ``pyarrow.compute`` (0.1-0.2
    CPU-s to import).  The values' bytes are written one byte position at a time (byte ``k``
    of every value at least ``k + 1`` long), so the temporaries are a few integers a value,
    never an index per byte (3 MiB instead of 88 for 131,072 paths of 28 bytes).
    """
    import pyarrow as pa

    blob, name_off = utf8_batch(names)
    codes = np.asarray(codes, dtype=np.int64)
    if codes.size and (int(codes.min()) < 0 or int(codes.max()) >= len(names)):
        raise ValueError("a code is outside the names")
    name_sizes = np.diff(name_off.astype(np.int64))
    sizes = name_sizes[codes]
    offsets = exclusive_cumsum(sizes)
    if offsets[-1] >= 2**31:
        raise ValueError("strings too long for an Arrow string array")
    width = int(name_sizes.max()) if len(names) else 0
    if 0 < width <= CODED_WIDTH:
        # a row of ``width`` bytes a name, gathered by code, then each row cut to its name's
        # length: 1 byte a byte of output where the index array below costs 8 (on 1M index
        # rows of one 28-byte source: 0.14 CPU-s against 1.5, at load 8)
        padded = np.zeros((len(names), width), np.uint8)
        for k, size in enumerate(name_sizes.tolist()):
            padded[k, :size] = blob[name_off[k] : name_off[k] + size]
        rows = padded[codes]
        same = bool((name_sizes == width).all())
        data = rows.reshape(-1) if same else rows[np.arange(width) < sizes[:, None]]
    else:
        at = np.repeat(name_off[:-1].astype(np.int64)[codes] - offsets[:-1], sizes)
        data = blob[at + np.arange(int(offsets[-1]))]
    buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), len(codes), buffers)


def numpy_view(array: pa.Array) -> np.ndarray:
    """Return a numeric Arrow array (no nulls) as numpy, zero-copy, without pandas.

    ``np.asarray`` and ``to_numpy`` on an Arrow array import pandas; this reads the data
    buffer itself.  Arrays with nulls, bools and non-numeric types go through ``to_numpy``.
    """
    import pyarrow as pa

    kind = array.type
    if array.null_count or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        out: np.ndarray = array.to_numpy(zero_copy_only=False)
        return out
    dtype = np.dtype(kind.to_pandas_dtype())
    buffer = array.buffers()[1]
    if buffer is None or not len(array):
        return np.zeros(0, dtype=dtype)
    data = np.frombuffer(buffer, dtype=dtype)
    return data[array.offset : array.offset + len(array)]
