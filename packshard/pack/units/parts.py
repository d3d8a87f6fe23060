"""Spill parts: the tokens of many work units, read back as one flat array.

Every map task spills its unit into a folder of its own (``tokens.bin``, ``labels.bin``: the
same flat int32 files as :class:`~packshard.pack.spill.SpillWriter` writes for a whole job).
The driver lays the parts end to end in unit order, so the examples of all units share one
flat token space; ``bases`` says where each part starts in it::

    part 0 (unit 0)        part 1 (unit 1)     part 2 (unit 2)
    [ex0 ex1 ex2 ........][ex3 ex4 .........][ex5 ...........]
    ^ bases[0] = 0        ^ bases[1]         ^ bases[2]        ^ bases[3] = total tokens

An example never crosses a part, so a range ``[start, start + length)`` of the flat space
lies in part ``searchsorted(bases, start, "right") - 1`` and is one positioned read of that
part's files.  When all the parts together are small (``WHOLE_BYTES``, tokens and labels:
the rule a one-folder spill keeps) each part a task needs is read whole, one at a time, and
its ranges gathered by a jitted loop: on the shared chat data (5,412 examples, 8 units) the
positioned reads cost more than the gather.  The folders must be on storage every worker
reaches (beside the output).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np
from numba import njit

from packshard.arrays import exclusive_cumsum

FILES = ("tokens.bin", "labels.bin")
WHOLE_BYTES = 64 * 1024 * 1024
"""Parts whose tokens and labels total at most this are read whole (see the docstring)."""


@dataclass(frozen=True, slots=True)
class PartFiles:
    """Where the parts live: ``folders[p]`` holds flat tokens ``bases[p]:bases[p + 1]``."""

    folders: tuple[str, ...]
    bases: np.ndarray  # int64 [parts + 1]

    @property
    def total(self) -> int:
        """Tokens over every part."""
        return int(self.bases[-1])


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
    part = np.searchsorted(parts.bases, starts, side="right") - 1
    local = starts - parts.bases[np.clip(part, 0, len(parts.folders) - 1)]
    if parts.total * 8 <= WHOLE_BYTES:
        for p in np.unique(part[lengths > 0]).tolist():
            sel = np.flatnonzero(part == p)
            size = int(parts.bases[p + 1] - parts.bases[p])
            for name, out in zip(FILES, (ids, labels), strict=True):
                path = os.path.join(parts.folders[p], name)
                whole = np.fromfile(path, dtype=np.int32, count=size)
                if whole.size < size:
                    raise EOFError(f"{path}: spill part ends early at byte {4 * whole.size}")
                gather_ranges(whole, local[sel], lengths[sel], out_start[sel], out)
        return ids, labels
    order = np.argsort(part, kind="stable")  # one open file per part, reads in file order
    for name, out in zip(FILES, (ids, labels), strict=True):
        view = out.data.cast("B")
        current, fh = -1, None
        try:
            for i in order.tolist():
                n = int(lengths[i])
                if n == 0:
                    continue
                if part[i] != current:
                    if fh is not None:
                        fh.close()
                    current = int(part[i])
                    fh = open(os.path.join(parts.folders[current], name), "rb", buffering=0)
                at = int(out_start[i])
                _pread_into(fh, view[4 * at : 4 * (at + n)], 4 * int(local[i]))  # type: ignore[arg-type]
        finally:
            if fh is not None:
                fh.close()
    return ids, labels


@njit(cache=True, nogil=True)
def gather_ranges(  # pragma: no cover - jitted
    source: np.ndarray, starts: np.ndarray, lengths: np.ndarray, at: np.ndarray, out: np.ndarray
) -> None:
    """Copy ``source[starts[i] : starts[i] + lengths[i]]`` to ``out[at[i]:]`` for every i."""
    for i in range(len(starts)):
        src, dst = starts[i], at[i]
        for j in range(lengths[i]):
            out[dst + j] = source[src + j]


def _pread_into(fh: io.FileIO, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        got = os.preadv(fh.fileno(), [view[done:]], offset + done)
        if not got:
            raise EOFError(f"{fh.name}: spill part ends early at byte {offset + done}")
        done += got
