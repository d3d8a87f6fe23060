"""Spill tokenized examples to disk and apply the overlong policy on the way.

The planner needs only lengths; the writer needs tokens again only when it assembles a shard.
So every tokenized chunk is appended to two flat, memory-mapped int32 files (``tokens.bin``,
``labels.bin``) in the run's temporary folder, while a few per-example integers stay in
memory (offset, length, loss tokens, source, line, part, domain, truncated, record)::

    chunk 0            chunk 1
    [ex0 ex1 ex2 ...] [ex3 ...]          tokens.bin / labels.bin (flat int32, on disk)
     ^   ^   ^          ^
     offsets (int64, in memory, one per example + 1)

Peak memory is the per-example arrays (~48 bytes an example) plus one chunk; tokens are read
back one shard at a time with positioned reads (:meth:`Spill.read_ranges`), not through the
memory map, so that the resident set does not grow to the size of the spill; sequential scans
of the map drop its pages as they go (:meth:`Spill.release_pages`).  A spill of at most
``IN_MEMORY_BYTES`` (16M tokens with their labels) is read back whole instead and gathered
in memory, a constant that buys the small runs most of their assembly time.

Overlong policy, applied per chunk before spilling (``L`` = ``max_seq_len``):

* ``drop``: the example becomes a reject with code ``too_long``;
* ``truncate``: keep the first ``L`` tokens; an example left with no target is dropped
  (code ``truncated_no_targets``);
* ``split``: consecutive parts of ``L`` tokens, each its own example (``part`` 0, 1, …);
  parts without a target are dropped; a record whose parts are all dropped is dropped
  (code ``split_no_targets``);
* ``error``: stop with a :class:`RecordError` naming ``file:line``.

"Target" counts labels other than the example's first, which packing always masks.
With the ``wrapped`` strategy the planner splits at row ends instead, so ``split`` is implied.
"""

from __future__ import annotations

import io
import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from packshard.errors import RecordError
from packshard.records import IGNORE_INDEX, Reject, TokenizedBatch

OVERLONG_POLICIES = ("drop", "truncate", "split", "error")
IN_MEMORY_BYTES = 64 * 1024 * 1024  # a spill this small (tokens + labels) is read back whole


@dataclass(frozen=True, slots=True)
class Spill:
    """Tokens and labels on disk plus per-example metadata in memory."""

    tokens: np.ndarray  # int32 memmap, flat
    labels: np.ndarray  # int32 memmap, flat
    offsets: np.ndarray  # int64 [n + 1]
    loss_tokens: np.ndarray  # int32 [n], targets excluding the first label
    source_index: np.ndarray  # int32 [n]
    lines: np.ndarray  # int64 [n]
    parts: np.ndarray  # int32 [n]
    starts: np.ndarray  # int64 [n], where the example begins in its record's tokens (split)
    domain_codes: np.ndarray  # int32 [n]
    truncated: np.ndarray  # bool [n]
    record_ids: np.ndarray  # int64 [n], one id per input record
    folder: Path | None = None  # where tokens.bin/labels.bin live (None: arrays in memory)

    @property
    def lengths(self) -> np.ndarray:
        """Token count of each spilled example (int64)."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return the tokens and labels of flat ranges ``[start, start + length)``, concatenated.

        A spill in memory is gathered by a jitted loop.  A file-backed one is read with one
        positioned read per range straight into the output arrays, never through the memory
        map: a shard's segments are scattered over the whole spill (rows are shuffled), and
        mapping them in would leave every page the kernel faults around them resident
        (measured: +315 MiB for 512 scattered ranges of a 336 MB file).
        """
        lengths = np.asarray(lengths, dtype=np.int64)
        out_start = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=out_start[1:])
        total = int(out_start[-1])
        ids = np.empty(total, dtype=np.int32)
        labels = np.empty(total, dtype=np.int32)
        if self.folder is None:
            starts = np.asarray(starts, dtype=np.int64)
            _gather(self.tokens, starts, lengths, out_start, ids)
            _gather(self.labels, starts, lengths, out_start, labels)
            return ids, labels
        places = list(
            zip(np.asarray(starts).tolist(), lengths.tolist(), out_start[:-1].tolist(), strict=True)
        )
        for name, out in (("tokens.bin", ids), ("labels.bin", labels)):
            view = out.data.cast("B")
            with open(self.folder / name, "rb", buffering=0) as fh:
                for start, length, at in places:
                    _read_into(fh, view[4 * at : 4 * (at + length)], 4 * start)
        return ids, labels

    def release_pages(self) -> None:
        """Drop the spill's mapped pages from this process's resident set.

        Pages of a read-only file mapping stay resident once touched, so gathering shard
        after shard from shuffled rows would end with the whole spill counted in the
        process's RSS (measured: +600 MiB for 84M tokens).  They are clean, so dropping them
        costs nothing but a re-read from the page cache if touched again.
        """
        for arr in (self.tokens, self.labels):
            mapped = getattr(arr.base, "obj", None)
            if isinstance(mapped, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
                mapped.madvise(mmap.MADV_DONTNEED)


def count_targets(labels: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per example, the labels that are targets, not counting each example's first label."""
    is_target = (labels != IGNORE_INDEX).astype(np.int64)
    csum = np.concatenate(([0], np.cumsum(is_target)))
    starts, ends = offsets[:-1], offsets[1:]
    counts = csum[ends] - csum[starts]
    nonempty = ends > starts
    counts[nonempty] -= is_target[starts[nonempty]]
    return counts


class SpillWriter:
    """Append tokenized chunks to a spill folder, applying the overlong policy."""

    def __init__(self, folder: Path, max_seq_len: int, overlong: str, split_at_rows: bool) -> None:
        self.folder = folder
        self.max_seq_len = max_seq_len
        self.overlong = overlong
        self.split_at_rows = split_at_rows  # wrapped: keep overlong examples whole
        self._tok = open(folder / "tokens.bin", "wb")
        self._lab = open(folder / "labels.bin", "wb")
        self._total = 0
        self._meta: dict[str, list[np.ndarray]] = {k: [] for k in _META}
        self._lengths: list[np.ndarray] = []
        self.records_split = 0
        self.tokens_truncated = 0
        self.parts_dropped = 0

    def add(
        self,
        batch: TokenizedBatch,
        source_index: np.ndarray,
        domain_codes: np.ndarray,
        record_ids: np.ndarray,
    ) -> list[Reject]:
        """Spill one chunk; return the rejects the overlong policy produced."""
        ids, labels, offsets = batch.input_ids, batch.labels, batch.offsets
        lengths = np.diff(offsets)
        n = len(lengths)
        lines = np.fromiter((r.line for r in batch.refs), dtype=np.int64, count=n)
        parts = np.zeros(n, dtype=np.int32)
        starts = np.zeros(n, dtype=np.int64)
        truncated = np.zeros(n, dtype=bool)
        rejects: list[Reject] = []
        limit = self.max_seq_len
        over = np.flatnonzero(lengths > limit) if not self.split_at_rows else np.empty(0, np.int64)
        if over.size:
            keep = np.ones(n, dtype=bool)
            for i in over:
                ref = batch.refs[i]
                size = int(lengths[i])
                if self.overlong == "error":
                    raise RecordError(
                        "too_long",
                        f"example is {size} tokens > max_seq_len {limit} "
                        "(use --overlong truncate|split|drop)",
                        ref.source,
                        ref.line,
                    )
                if self.overlong == "drop":
                    keep[i] = False
                    rejects.append(
                        Reject(
                            ref,
                            batch.domains[i],
                            "too_long",
                            f"example is {size} tokens > max_seq_len {limit} "
                            "(dropped; use --overlong truncate|split to keep it)",
                        )
                    )
            if self.overlong in ("truncate", "split"):
                ids, labels, offsets, index, parts, truncated = _cut(
                    ids, labels, offsets, limit, over, split=self.overlong == "split"
                )
                starts = parts.astype(np.int64) * limit
                self.tokens_truncated += int(lengths[over].sum() - limit * over.size) * (
                    self.overlong == "truncate"
                )
                self.records_split += int(over.size) * (self.overlong == "split")
                keep = np.ones(len(index), dtype=bool)
                source_index, domain_codes, record_ids, lines = (
                    source_index[index],
                    domain_codes[index],
                    record_ids[index],
                    lines[index],
                )
                targets = count_targets(labels, offsets)
                empty = (targets == 0) & (truncated | (parts > 0) | np.isin(index, over))
                keep &= ~empty
                self.parts_dropped += int(empty.sum()) * (self.overlong == "split")
                rejects.extend(_dropped_records(batch, index, keep, empty, self.overlong))
            if not keep.all():
                ids, labels, offsets = _select(ids, labels, offsets, keep)
                source_index, domain_codes, record_ids, lines = (
                    source_index[keep],
                    domain_codes[keep],
                    record_ids[keep],
                    lines[keep],
                )
                parts, starts, truncated = parts[keep], starts[keep], truncated[keep]
        self._write(ids, labels, offsets)
        meta: dict[str, np.ndarray] = {
            "loss_tokens": count_targets(labels, offsets).astype(np.int32),
            "source_index": source_index.astype(np.int32),
            "lines": lines,
            "parts": parts,
            "starts": starts,
            "domain_codes": domain_codes.astype(np.int32),
            "truncated": truncated,
            "record_ids": record_ids.astype(np.int64),
        }
        for key, arr in meta.items():
            self._meta[key].append(arr)
        return rejects

    def _write(self, ids: np.ndarray, labels: np.ndarray, offsets: np.ndarray) -> None:
        lo, hi = int(offsets[0]), int(offsets[-1])
        self._tok.write(np.ascontiguousarray(ids[lo:hi], dtype=np.int32).tobytes())
        self._lab.write(np.ascontiguousarray(labels[lo:hi], dtype=np.int32).tobytes())
        self._lengths.append(np.diff(offsets))
        self._total += hi - lo

    def finish(self) -> Spill:
        """Close the files and return the spill (in memory up to ``IN_MEMORY_BYTES``)."""
        self._tok.close()
        self._lab.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        meta = {
            k: (np.concatenate(v) if v else np.zeros(0, _META[k])) for k, v in self._meta.items()
        }
        if self._total * 8 <= IN_MEMORY_BYTES:  # small: read back whole, gathered in memory
            return Spill(
                tokens=np.fromfile(self.folder / "tokens.bin", dtype=np.int32),
                labels=np.fromfile(self.folder / "labels.bin", dtype=np.int32),
                offsets=offsets,
                **meta,
                folder=None,
            )
        return Spill(
            tokens=_memmap(self.folder / "tokens.bin", self._total),
            labels=_memmap(self.folder / "labels.bin", self._total),
            offsets=offsets,
            **meta,
            folder=self.folder,
        )


_META = {
    "loss_tokens": np.int32,
    "source_index": np.int32,
    "lines": np.int64,
    "parts": np.int32,
    "starts": np.int64,
    "domain_codes": np.int32,
    "truncated": np.bool_,
    "record_ids": np.int64,
}


def _read_into(fh: io.FileIO, view: memoryview, offset: int) -> None:
    fh.seek(offset)
    done = 0
    while done < len(view):
        got = fh.readinto(view[done:])
        if not got:
            raise EOFError(f"{fh.name}: spill file ends early at byte {offset + done}")
        done += got


@njit(cache=True, nogil=True)
def _gather(  # pragma: no cover - jitted
    source: np.ndarray, starts: np.ndarray, lengths: np.ndarray, at: np.ndarray, out: np.ndarray
) -> None:
    for i in range(len(starts)):
        src, dst = starts[i], at[i]
        for j in range(lengths[i]):
            out[dst + j] = source[src + j]


def _memmap(path: Path, size: int) -> np.ndarray:
    """Map ``size`` int32 values of ``path`` read-only (see :meth:`Spill.release_pages`)."""
    if size == 0:
        return np.zeros(0, dtype=np.int32)
    with open(path, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, dtype=np.int32, count=size)


def _cut(
    ids: np.ndarray,
    labels: np.ndarray,
    offsets: np.ndarray,
    limit: int,
    over: np.ndarray,
    split: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Truncate or split the examples listed in ``over``; others pass through unchanged.

    Returns new ``ids, labels, offsets`` and, per new example, the index of the example it
    came from, its part number and whether it was truncated.
    """
    lengths = np.diff(offsets)
    pieces = np.ones(len(lengths), dtype=np.int64)
    if split:
        pieces[over] = -(-lengths[over] // limit)
    index = np.repeat(np.arange(len(lengths)), pieces)
    first = np.concatenate(([0], np.cumsum(pieces)[:-1]))
    part = np.arange(len(index)) - np.repeat(first, pieces)
    start = offsets[index] + part * limit
    end = np.minimum(start + limit, offsets[index + 1])
    new_lengths = end - start
    gather = np.repeat(start - np.concatenate(([0], np.cumsum(new_lengths)[:-1])), new_lengths)
    gather += np.arange(int(new_lengths.sum()))
    new_offsets = np.concatenate(([0], np.cumsum(new_lengths))).astype(np.int64)
    truncated = np.zeros(len(index), dtype=bool)
    if not split:
        truncated[over] = True
    return (
        ids[gather],
        labels[gather],
        new_offsets,
        index,
        part.astype(np.int32),
        truncated,
    )


def _select(
    ids: np.ndarray, labels: np.ndarray, offsets: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = np.diff(offsets)
    mask = np.repeat(keep, lengths)
    new_offsets = np.concatenate(([0], np.cumsum(lengths[keep]))).astype(np.int64)
    return ids[offsets[0] : offsets[-1]][mask], labels[offsets[0] : offsets[-1]][mask], new_offsets


def _dropped_records(
    batch: TokenizedBatch, index: np.ndarray, keep: np.ndarray, empty: np.ndarray, policy: str
) -> list[Reject]:
    """Rejects for records none of whose pieces survived the overlong policy."""
    kept_any = np.zeros(len(batch), dtype=bool)
    kept_any[index[keep]] = True
    touched = np.zeros(len(batch), dtype=bool)
    touched[index[empty]] = True
    out = []
    for i in np.flatnonzero(touched & ~kept_any):
        if policy == "truncate":
            code, why = "truncated_no_targets", "no target token left after truncation"
        else:
            code, why = "split_no_targets", "no part kept a target token after splitting"
        out.append(Reject(batch.refs[i], batch.domains[i], code, f"{why} (dropped)"))
    return out
