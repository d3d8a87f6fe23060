"""Spill parts: the tokens of many work units, read back as one flat array.

Every map task spills its unit into a folder of its own (``tokens.bin``, ``labels.bin``: the
same flat int32 files as :class:`~packshard.pack.spill.SpillWriter` writes for a whole job).
The driver lays the parts end to end in unit order, so the examples of all units share one
flat token space; ``bases`` says where each part starts in it::

    part 0 (unit 0)        part 1 (unit 1)     part 2 (unit 2)
    [ex0 ex1 ex2 ........][ex3 ex4 .........][ex5 ...........]
    ^ bases[0] = 0        ^ bases[1]         ^ bases[2]        ^ bases[3] = total tokens

An example never crosses a part, so a range ``[start, start + length)`` of the flat space
lies in part ``searchsorted(bases, start, "right") - 1``.  A :class:`PartReader` takes the
ranges of a read part by part, in file order.  Where the job has at most ``MAX_MAPS`` files
of parts, it maps each read-only on first use, keeps the map while the reader lives, and
copies the ranges into place with a jitted loop: a write task keeps one reader for all its
row groups, so each page of the spill is faulted in once however many row groups touch it
(the pages are the page cache's, not the process's own memory).  Past that count (a job of
thousands of units, where a row group meets most parts once or not at all) each range is one
positioned read straight into place, and no map is made for a single range.  Either way
nothing of the spill is copied but the ranges asked for.

Measured, CPU-seconds of reading back the 20 row groups of one shard of 20.5M phi-3 tokens
from 152 parts (102,828 examples, every row group touching every part), side by side: a
positioned read per range 0.29-0.38 s, every part read whole for each row group 0.74-0.79,
the kept maps 0.14-0.15.  A map made again for every row group had cost about 30 µs and a
page fault a range, no cheaper than the reads: kept, its faults are paid once.  The folders
must be on storage every worker reaches (beside the output).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
from numba import njit

from packshard.arrays import exclusive_cumsum

FILES = ("tokens.bin", "labels.bin")
MAX_MAPS = 4096
"""Files of parts (two a part: tokens and labels) up to which a :class:`PartReader` maps them."""


@dataclass(frozen=True, slots=True)
class PartFiles:
    """Where the parts live: ``folders[p]`` holds flat tokens ``bases[p]:bases[p + 1]``."""

    folders: tuple[str, ...]
    bases: np.ndarray  # int64 [parts + 1]

    @property
    def total(self) -> int:
        """Tokens over every part."""
        return int(self.bases[-1])


@dataclass(slots=True)
class PartReader:
    """Reads flat ranges of ``parts``: mapped once for the reader's life, or read in place."""

    parts: PartFiles
    _maps: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)

    def read(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return the tokens and labels of ranges ``[start, start + length)``, concatenated."""
        lengths = np.asarray(lengths, dtype=np.int64)
        starts = np.asarray(starts, dtype=np.int64)
        out_start = exclusive_cumsum(lengths)
        total = int(out_start[-1])
        ids = np.empty(total, dtype=np.int32)
        labels = np.empty(total, dtype=np.int32)
        wanted = np.flatnonzero(lengths > 0)
        bases = self.parts.bases
        part = np.searchsorted(bases, starts[wanted], side="right") - 1
        order = np.lexsort((starts[wanted], part))  # each part's ranges together, in file order
        wanted, part = wanted[order], part[order]
        bounds = np.flatnonzero(np.diff(part, prepend=-1, append=-1)).tolist()
        mapped = len(FILES) * (len(bases) - 1) <= MAX_MAPS
        for lo, hi in pairwise(bounds):
            p, sel = int(part[lo]), wanted[lo:hi]
            local = starts[sel] - bases[p]
            for f, out in enumerate((ids, labels)):
                if mapped:
                    gather_ranges(self._mapped(p, f), local, lengths[sel], out_start[sel], out)
                else:  # byte offsets in the part, byte counts, byte offsets in the output
                    spans = [(4 * v).tolist() for v in (local, lengths[sel], out_start[sel])]
                    _read_ranges(os.path.join(self.parts.folders[p], FILES[f]), out, *spans)
        return ids, labels

    def _mapped(self, part: int, file: int) -> np.ndarray:
        """Return part ``part``'s file ``FILES[file]`` as an int32 array (a map, kept)."""
        key = (part, file)
        found = self._maps.get(key)
        if found is not None:
            return found
        path = os.path.join(self.parts.folders[part], FILES[file])
        size = int(self.parts.bases[part + 1] - self.parts.bases[part])
        have = os.path.getsize(path) // 4
        if have < size:  # checked before any copy: a jitted loop would read past the map
            raise EOFError(f"{path}: spill part ends early at byte {4 * have}")
        # copy-on-write: never written, so the pages stay the page cache's, and the array is
        # the writable kind every other caller of the jitted loop passes (one signature)
        found = self._maps[key] = np.memmap(path, dtype=np.int32, mode="c", shape=(size,))
        return found


def read_part_ranges(
    parts: PartFiles, starts: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return the tokens and labels of flat ranges, concatenated: one read, one reader."""
    return PartReader(parts).read(starts, lengths)


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
