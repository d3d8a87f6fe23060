"""Spill parts: the tokens of many work units, read back as one flat array.

Every map task spills its unit into a folder of its own (``tokens.bin``, ``labels.bin``: the
same flat int32 files as :class:`~packshard.pack.spill.SpillWriter` writes for a whole job).
The driver lays the parts end to end in unit order, so the examples of all units share one
flat token space; ``bases`` says where each part starts in it::

    part 0 (unit 0)        part 1 (unit 1)     part 2 (unit 2)
    [ex0 ex1 ex2 ........][ex3 ex4 .........][ex5 ...........]
    ^ bases[0] = 0        ^ bases[1]         ^ bases[2]        ^ bases[3] = total tokens

An example never crosses a part, so a range ``[start, start + length)`` of the flat space
lies in part ``searchsorted(bases, start, "right") - 1``.  A read takes its ranges part by
part, in file order, each part's file opened once: when all the parts together are small
(``WHOLE_BYTES``, tokens and labels: the rule a one-folder spill keeps) the part is read
whole and its ranges gathered by a jitted loop, else each range is one positioned read
straight into place, so memory never holds more of the spill than the ranges asked for.
Ranges of at most ``SHORT_RANGE`` tokens on average are gathered from a memory map of each
part by the jitted loop instead: one read call a range would cost more than the tokens
(``docs/performance.md``, "Reading the spill's parts").
The folders must be on storage every worker reaches (beside
the output).

A part may hold its labels folded into ``tokens.bin`` (``PartFiles.folded``: the token where
its label trains it, else ``~token``, negative), as ``repack`` lays out a parent's tokens:
half the bytes written and read, split again as they are read (:func:`unfold_labels`)::

    tokens  [ 7   8   9   4   5 ]      labels  [ -  8  9  -  5 ]      ('-' = IGNORE_INDEX)
    folded  [-8   8   9  -5   5 ]
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from numba import njit

from packshard.arrays import exclusive_cumsum
from packshard.records import IGNORE_INDEX

FILES = ("tokens.bin", "labels.bin")
WHOLE_BYTES = 64 * 1024 * 1024
"""Parts whose tokens and labels total at most this are read whole (see the docstring)."""
WINDOW = 1 << 20
"""Values (4 MiB) a part is read at a time when read whole (:func:`_gather_whole`)."""
SHORT_RANGE = 128
"""Ranges of at most this many tokens on average are gathered from a memory map instead."""


@dataclass(frozen=True, slots=True)
class PartFiles:
    """Where the parts live: ``folders[p]`` holds flat tokens ``bases[p]:bases[p + 1]``."""

    folders: tuple[str, ...]
    bases: np.ndarray  # int64 [parts + 1]
    folded: bool = False
    """Each part holds ``tokens.bin`` alone, its labels folded in (:func:`unfold_labels`)."""


def read_part_ranges(
    parts: PartFiles, starts: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return the tokens and labels of flat ranges ``[start, start + length)``, concatenated."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    out_start = exclusive_cumsum(lengths)
    total = int(out_start[-1])
    ids = np.empty(total, dtype=np.int32)
    labels = np.empty(total, dtype=np.int32)
    names = FILES[:1] if parts.folded else FILES
    _read_into(parts, starts, lengths, out_start, tuple(zip(names, (ids, labels), strict=False)))
    if parts.folded:
        unfold_labels(ids, labels)
    return ids, labels


def _read_into(
    parts: PartFiles,
    starts: np.ndarray,
    lengths: np.ndarray,
    out_start: np.ndarray,
    files: tuple[tuple[str, np.ndarray], ...],
) -> None:
    """Read the ranges of each file ``name`` of the parts into its ``out`` (``files``)."""
    total = int(out_start[-1])
    if len(parts.folders) == 1 and total and np.array_equal(starts - starts[0], out_start[:-1]):
        # one run of the part (a repack laid out in the shards' order): one read a file
        first = 4 * int(starts[0] - parts.bases[0])
        for name, out in files:
            _read_ranges(os.path.join(parts.folders[0], name), out, [first], [4 * total], [0])
        return
    if len(parts.folders) == 1 and int(parts.bases[-1]) * 8 <= WHOLE_BYTES:
        # one part read whole: every range gathered in place, in any order (an empty one
        # copies nothing), with no per-range index arrays beside the ranges themselves
        size = int(parts.bases[1] - parts.bases[0])
        local = starts - parts.bases[0] if int(parts.bases[0]) else starts
        for name, out in files:
            _gather_whole(
                os.path.join(parts.folders[0], name), size, local, lengths, out_start, out
            )
        return
    wanted = np.flatnonzero(lengths > 0)
    part = np.searchsorted(parts.bases, starts[wanted], side="right") - 1
    order = np.lexsort((starts[wanted], part))  # each part's ranges together, in file order
    wanted, part = wanted[order], part[order]
    bounds = np.flatnonzero(np.diff(part, prepend=-1, append=-1)).tolist()
    gather = None
    if int(parts.bases[-1]) * 8 <= WHOLE_BYTES:  # tokens and labels of every part
        gather = _gather_whole
    elif total <= SHORT_RANGE * len(wanted):  # short ranges: a read call costs more than its bytes
        gather = _gather_mapped
    if gather is not None:
        for lo, hi in pairwise(bounds):
            p, sel = int(part[lo]), wanted[lo:hi]
            size = int(parts.bases[p + 1] - parts.bases[p])
            local = starts[sel] - parts.bases[p]
            for name, out in files:
                path = os.path.join(parts.folders[p], name)
                gather(path, size, local, lengths[sel], out_start[sel], out)
        return
    # byte offsets in the part, byte counts, byte offsets in the output: plain ints, made once
    spans = [
        (4 * values).tolist()
        for values in (starts[wanted] - parts.bases[part], lengths[wanted], out_start[wanted])
    ]
    for lo, hi in pairwise(bounds):
        folder = parts.folders[int(part[lo])]
        for name, out in files:
            _read_ranges(os.path.join(folder, name), out, *(s[lo:hi] for s in spans))


def _gather_whole(
    path: str, size: int, starts: np.ndarray, lengths: np.ndarray, at: np.ndarray, out: np.ndarray
) -> None:
    """Gather ranges of the ``size`` int32 of ``path`` into ``out``, the file read whole.

    A part past :data:`WINDOW` values is read a window at a time, the ranges taken in file
    order (each window from the first range not yet gathered): the file is read once, as
    whole, and memory holds one window of it, not the part (``read_window_ranges``).
    """
    if size <= WINDOW:
        source = np.fromfile(path, dtype=np.int32, count=size)
        if source.size < size:
            raise EOFError(f"{path}: spill part ends early at byte {4 * source.size}")
        gather_ranges(source, starts, lengths, at, out)
        return
    if os.path.getsize(path) < 4 * size:
        raise EOFError(f"{path}: spill part ends early at byte {os.path.getsize(path)}")
    read_window_ranges(path, starts, lengths, at, out, WINDOW)


def read_window_ranges(
    path: str,
    starts: np.ndarray,
    lengths: np.ndarray,
    at: np.ndarray,
    out: np.ndarray,
    window: int,
) -> None:
    """Copy int32 ranges ``[starts[i], starts[i] + lengths[i])`` of ``path`` to ``out[at[i]:]``.

    Windows of ``window`` values (or one range, where it is longer) are read in file order,
    each from the first range not yet copied; every range within it is gathered from it.
    """
    order = np.argsort(starts, kind="stable")
    first, size, to = starts[order], lengths[order], at[order]
    reach = np.maximum.accumulate(first + size) if len(order) else first  # ranges may repeat
    buffer = np.empty(window, np.int32)
    i, n = 0, len(order)
    with open(path, "rb") as fh:
        while i < n:
            lo = int(first[i])
            j = max(int(np.searchsorted(reach, lo + window, side="right")), i + 1)
            hi = int(reach[j - 1])
            view = buffer[: hi - lo] if hi - lo <= window else np.empty(hi - lo, np.int32)
            fh.seek(4 * lo)
            if fh.readinto(view.data.cast("B")) < 4 * (hi - lo):
                raise EOFError(f"{path}: spill part ends before byte {4 * hi}")
            gather_ranges(view, first[i:j] - lo, size[i:j], to[i:j], out)
            i = j


def _gather_mapped(
    path: str, size: int, starts: np.ndarray, lengths: np.ndarray, at: np.ndarray, out: np.ndarray
) -> None:
    """Gather ranges of the ``size`` int32 of ``path`` into ``out`` through a memory map."""
    if os.path.getsize(path) < 4 * size:
        raise EOFError(f"{path}: spill part ends early at byte {os.path.getsize(path)}")
    if size:
        mapped = np.memmap(path, dtype=np.int32, mode="r", shape=(size,))
        gather_ranges(mapped, starts, lengths, at, out)
        del mapped  # unmapped here: the resident set keeps only the ranges' pages meanwhile


def _read_ranges(
    path: str, out: np.ndarray, offsets: list[int], sizes: list[int], at: list[int]
) -> None:
    """Read bytes ``offsets[i]:offsets[i] + sizes[i]`` of ``path`` to byte ``at[i]`` of ``out``."""
    view = out.data.cast("B")
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset, n, to in zip(offsets, sizes, at, strict=True):
            done = os.preadv(fd, [view[to : to + n]], offset)
            while done < n:  # a short read: the rest, or the end of a part cut short
                got = os.preadv(fd, [view[to + done : to + n]], offset + done)
                if not got:
                    raise EOFError(f"{path}: spill part ends early at byte {offset + done}")
                done += got
    finally:
        os.close(fd)


@njit(cache=True, nogil=True)
def gather_ranges(  # pragma: no cover - jitted
    source: np.ndarray, starts: np.ndarray, lengths: np.ndarray, at: np.ndarray, out: np.ndarray
) -> None:
    """Copy ``source[starts[i] : starts[i] + lengths[i]]`` to ``out[at[i]:]`` for every i."""
    for i in range(len(starts)):
        src, dst = starts[i], at[i]
        for j in range(lengths[i]):
            out[dst + j] = source[src + j]


@njit(cache=True, nogil=True)
def unfold_labels(values: np.ndarray, labels: np.ndarray) -> None:  # pragma: no cover - jitted
    """Split folded ``values`` in place into their tokens and ``labels``.

    A folded value is the token where its label trains it, else ``~token`` (negative): a
    label is ``IGNORE_INDEX`` or its token (the shards' contract) and a token is at least 0,
    so one int32 holds both, half the bytes of a file each.
    """
    for t in range(len(values)):
        value = values[t]
        if value < 0:
            values[t] = ~value
            labels[t] = IGNORE_INDEX
        else:
            labels[t] = value
