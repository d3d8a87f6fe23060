"""Spill tokenized examples to disk, applying the overlong policy on the way.

The planner needs only lengths; the writer needs tokens again only when it assembles a shard.
So every tokenized chunk is appended to two flat int32 files (``tokens.bin``, ``labels.bin``)
in the run's temporary folder, while a few per-example integers stay in memory (offset,
length, loss tokens, source, line, part, start, domain, format, truncated, record)::

    chunk 0            chunk 1
    [ex0 ex1 ex2 ...] [ex3 ...]          tokens.bin / labels.bin (flat int32, on disk)
     ^   ^   ^          ^
     offsets (int64, in memory, one per example + 1)

Peak memory is those per-example arrays (30 to 42 bytes an example, each in its
:func:`smallest` type) plus one chunk.  The tokens are read back one shard at a time with
positioned reads (:meth:`Spill.read_ranges`), never through a memory map, so the resident
set does not grow to the size of the spill.  :class:`SpillWriter` owns what it counts
(:class:`SpillCounts`) and returns it in the :class:`Spill`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from operator import ne
from pathlib import Path
from typing import Any

import numpy as np

from packshard.arrays import NameCodes, add_counts, count_trained, exclusive_cumsum
from packshard.errors import UsageError
from packshard.ingest.types import TokenizedBatch
from packshard.pack.overlong import apply_overlong, police_pairs
from packshard.pack.units.parts import FILES, PartFiles, read_part_ranges
from packshard.records import Reject, SourceRef, SourceRefs


@dataclass(frozen=True, slots=True)
class SpillCounts:
    """What the spill writer accepted and what its overlong policy did."""

    sources: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()
    formats: tuple[str, ...] = ()
    records_per_source: tuple[int, ...] = ()  # records ingest accepted, per input
    records_per_domain: tuple[int, ...] = ()
    tokens_in_per_domain: tuple[int, ...] = ()  # tokens before the overlong policy
    tokens_truncated: int = 0
    records_split: int = 0
    parts_dropped: int = 0


@dataclass(frozen=True, slots=True)
class Spill:
    """Tokens and labels on disk (or in memory) plus per-example metadata in memory.

    ``source_index``, ``domain_codes`` and ``format_codes`` index ``counts.sources``,
    ``counts.domains`` and ``counts.formats``.
    """

    tokens: np.ndarray  # int32, flat
    labels: np.ndarray  # int32, flat
    offsets: np.ndarray  # int64 [n + 1]; int32 from a merge or a unit while the tokens fit
    loss_tokens: np.ndarray  # int32 [n], targets excluding the first label
    source_index: np.ndarray  # int32 [n]
    lines: np.ndarray  # int64 [n]
    parts: np.ndarray  # int32 [n]
    starts: np.ndarray  # int64 [n], where the example begins in its record's tokens (split)
    domain_codes: np.ndarray  # int32 [n]
    truncated: np.ndarray  # bool [n]
    record_ids: np.ndarray  # int64 [n], one id per accepted input record
    format_codes: np.ndarray  # int8 [n]
    counts: SpillCounts = field(default_factory=SpillCounts)
    turns: np.ndarray | None = None  # int32 [n], the message a --turns expand example trains
    pair_codes: np.ndarray | None = None  # int8 [n], PAIR_CODES (0 plain, 1/2 chosen/rejected …)
    images: np.ndarray | None = None  # int32 [n], the example's images (None or 0: none)
    part_files: PartFiles | None = None  # the work units' spill parts (tokens/labels then empty)

    @property
    def lengths(self) -> np.ndarray:
        """Token count of each spilled example (int64)."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def without(self, *names: str) -> Spill:
        """Return the spill with the per-example arrays ``names`` emptied.

        The driver drops what no later stage reads, so that its memory is freed before the
        next stage's working set is made (``pack/pipeline.py``).
        """
        dropped: dict[str, Any] = {
            n: np.zeros(0, getattr(self, n).dtype) for n in names if getattr(self, n) is not None
        }
        return replace(self, **dropped)

    def compacted(self, *names: str) -> Spill:
        """Return the spill with the integer arrays ``names`` in their :func:`smallest` type.

        For a stage that only reads them: the examples index reads each source, domain,
        turn and start once, and one input, one domain, no split and no ``--turns expand``
        make them one byte an example instead of four.
        """
        picked: dict[str, Any] = {
            n: smallest(getattr(self, n)) for n in names if getattr(self, n) is not None
        }
        return replace(self, **picked)

    def rejects(self, examples: np.ndarray, code: str, reason: str) -> tuple[Reject, ...]:
        """One ``code`` reject per example of ``examples``, naming its input, line and domain."""
        counts = self.counts
        return tuple(
            Reject(
                SourceRef(counts.sources[self.source_index[ex]], int(self.lines[ex])),
                counts.domains[self.domain_codes[ex]],
                code,
                reason,
            )
            for ex in examples.tolist()
        )

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return the tokens and labels of flat ranges ``[start, start + length)``, concatenated.

        A spill on disk is read from its parts (:func:`read_part_ranges`), one in memory (made
        by tests; ``pack``'s spills are on disk) is indexed by every position of the ranges.
        """
        if self.part_files is not None:
            return read_part_ranges(self.part_files, starts, lengths)
        lengths = np.asarray(lengths, dtype=np.int64)
        shift = np.asarray(starts, dtype=np.int64) - exclusive_cumsum(lengths)[:-1]
        at = np.repeat(shift, lengths) + np.arange(int(lengths.sum()))
        return self.tokens[at], self.labels[at]


PER_EXAMPLE = {
    "loss_tokens": np.int32,
    "source_index": np.int32,
    "lines": np.int64,
    "parts": np.int32,
    "starts": np.int64,
    "domain_codes": np.int32,
    "truncated": np.bool_,
    "record_ids": np.int64,
    "format_codes": np.int8,
    "turns": np.int32,
    "pair_codes": np.int8,
    "images": np.int32,
}


WIDE = ("lines", "starts", "record_ids")  # may pass 2**31: int32 whenever they do not


def narrow(values: np.ndarray) -> np.ndarray:
    """Return int64 ``values`` as int32 when every value fits, else unchanged (readers widen)."""
    if values.dtype == np.int32:  # as it is: no pass over it (nor over a mapped file's pages)
        return values
    if values.size and (int(values.min()) < -(2**31) or int(values.max()) >= 2**31):
        return values
    return values.astype(np.int32, copy=False)


def smallest(values: np.ndarray) -> np.ndarray:
    """Return integer ``values`` as int8, int16 or int32, the smallest that holds them all.

    Unchanged when none does (or when they are not signed integers); readers widen.
    """
    if values.dtype.kind != "i" or not values.size:
        return values
    low, high = int(values.min()), int(values.max())
    for kind in (np.int8, np.int16, np.int32):
        if np.iinfo(kind).min <= low and high <= np.iinfo(kind).max:
            return values.astype(kind, copy=False)
    return values


def whole_images(batch: TokenizedBatch, max_seq_len: int, overlong: str, wrapped: bool) -> None:
    """Refuse to cut an example with images: its image tokens would lose their pixels.

    Raises:
        UsageError: ``--strategy wrapped`` (it cuts examples at row ends), or an example with
            images over ``max_seq_len`` under ``--overlong truncate|split``, naming it.

    """
    assert batch.images is not None
    has = np.flatnonzero(batch.images)
    if wrapped and has.size:
        ref = batch.refs[int(has[0])]
        raise UsageError(
            f"{ref.source}:{ref.line}: --strategy wrapped cuts examples at row ends, and an "
            "example with images is never cut (use --strategy bfd)"
        )
    lengths = np.diff(batch.offsets)[has]
    if overlong in ("truncate", "split") and (lengths > max_seq_len).any():
        i = int(has[np.argmax(lengths > max_seq_len)])
        ref = batch.refs[i]
        raise UsageError(
            f"{ref.source}:{ref.line}: an example with images is {int(np.diff(batch.offsets)[i])} "
            f"tokens > max_seq_len {max_seq_len}, and it is never cut (use --overlong drop, or "
            "a larger --max-seq-len)"
        )


class SpillWriter:
    """Append tokenized chunks to a spill folder, applying the overlong policy.

    ``sources`` are the input paths, in order.  ``split_at_rows`` (``wrapped``) keeps overlong
    examples whole.  ``compact`` keeps each chunk's per-example arrays in their
    :func:`smallest` types (a work unit's, which the merge widens).
    """

    def __init__(
        self,
        folder: Path,
        max_seq_len: int,
        overlong: str,
        split_at_rows: bool,
        sources: tuple[str, ...] = (),
        compact: bool = False,
    ) -> None:
        self.folder = folder
        self.compact = compact
        self.max_seq_len = max_seq_len
        self.overlong = overlong
        self.split_at_rows = split_at_rows
        self._files = [open(folder / name, "wb") for name in FILES]
        self._hashes = {name: hashlib.sha256() for name in FILES}
        self._meta: dict[str, list[np.ndarray]] = {k: [] for k in PER_EXAMPLE}
        self._lengths: list[np.ndarray] = []
        self._sources, self._domains, self._formats = NameCodes(sources), NameCodes(), NameCodes()
        self._records = 0
        self._per_source = np.zeros(len(sources), np.int64)
        self._per_domain = np.zeros(0, np.int64)
        self._tokens_in = np.zeros(0, np.int64)
        self._policy = {"tokens_truncated": 0, "records_split": 0, "parts_dropped": 0}

    def add(self, batch: TokenizedBatch) -> tuple[Reject, ...]:
        """Spill one chunk; return the rejects the overlong policy produced."""
        source, domain, fmt, first = self._codes(batch)
        self._count(source, domain, np.diff(batch.offsets), first)  # pairs dropped below too
        # a pair is one unit: policed before its branches (no pairs: nothing happens)
        batch, cut, pair_rejects, pair_tokens = police_pairs(batch, self.max_seq_len, self.overlong)
        self._policy["tokens_truncated"] += pair_tokens
        if pair_rejects:
            source, domain, fmt, first = self._codes(batch)
        n = len(batch)
        record = np.cumsum(first) - 1
        record_ids = self._records + record
        self._records += int(first.sum())
        if batch.images is not None:
            whole_images(batch, self.max_seq_len, self.overlong, self.split_at_rows)
        policed = apply_overlong(
            batch, self.max_seq_len, self.overlong, not self.split_at_rows, record
        )
        for key in self._policy:
            self._policy[key] += getattr(policed, key)
        at = policed.index
        refs = batch.refs
        if isinstance(refs, SourceRefs):  # columns already: no value per example is made
            lines = refs.lines.astype(np.int64, copy=False)
        else:
            lines = np.fromiter((r.line for r in refs), dtype=np.int64, count=n)
        self._write(policed.ids, policed.labels, policed.offsets)
        meta = {
            "loss_tokens": count_trained(policed.labels, policed.offsets),
            "source_index": source[at],
            "lines": lines[at],
            "parts": policed.parts,
            "starts": policed.parts.astype(np.int64) * self.max_seq_len,
            "domain_codes": domain[at],
            "truncated": policed.truncated | cut[at],
            "record_ids": record_ids[at],
            "format_codes": fmt[at],
            "turns": batch.turns[at] if batch.turns is not None else np.zeros(len(at), np.int32),
            "pair_codes": batch.pairs[at]
            if batch.pairs is not None
            else np.zeros(len(at), np.int8),
            "images": batch.images[at] if batch.images is not None else np.zeros(len(at), np.int32),
        }
        for key, arr in meta.items():
            arr = arr.astype(PER_EXAMPLE[key], copy=False)
            self._meta[key].append(smallest(arr) if self.compact else arr)
        return pair_rejects + policed.rejects

    def _codes(self, batch: TokenizedBatch) -> tuple[np.ndarray, ...]:
        """Return each example's source, domain and format code, and whether it starts a record."""
        n = len(batch)
        refs = batch.refs
        if isinstance(refs, SourceRefs):
            source = self._sources.encode(refs.names)[refs.codes]
        else:
            source = self._sources.encode(tuple(r.source for r in refs))
        domain = self._domains.encode(batch.domains)
        fmt = self._formats.encode(batch.formats)
        first = np.ones(n, dtype=bool)  # the first example of each record (expand, pairs: several)
        if (batch.turns is not None or batch.pairs is not None) and n > 1:
            refs = batch.refs
            first[1:] = np.fromiter(map(ne, refs[1:], refs[:-1]), dtype=bool, count=n - 1)
        return source, domain, fmt, first

    def _count(
        self, source: np.ndarray, domain: np.ndarray, lengths: np.ndarray, first: np.ndarray
    ) -> None:
        """Count accepted records per input and per domain, and tokens per domain."""
        ndom, nsrc = len(self._domains.names), len(self._sources.names)  # every count that long
        self._per_source = add_counts(self._per_source, np.bincount(source[first], minlength=nsrc))
        per_domain = np.bincount(domain[first], minlength=ndom)
        self._per_domain = add_counts(self._per_domain, per_domain)
        tokens = np.bincount(domain, weights=lengths, minlength=ndom).astype(np.int64)
        self._tokens_in = add_counts(self._tokens_in, tokens)

    def _write(self, ids: np.ndarray, labels: np.ndarray, offsets: np.ndarray) -> None:
        lo, hi = int(offsets[0]), int(offsets[-1])
        for fh, name, values in zip(self._files, FILES, (ids, labels), strict=True):
            data = np.ascontiguousarray(values[lo:hi], dtype=np.int32)
            self._hashes[name].update(data.data)  # hashed as written: never read back to hash
            fh.write(data.data)
        lengths = np.diff(offsets)
        self._lengths.append(smallest(lengths) if self.compact else lengths)

    def digests(self) -> dict[str, str]:
        """Return the SHA-256 of each file written so far (``tokens.bin``, ``labels.bin``)."""
        return {name: digest.hexdigest() for name, digest in self._hashes.items()}

    def finish(self) -> Spill:
        """Close the files and return the spill: its per-example arrays, its tokens on disk."""
        for fh in self._files:
            fh.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        self._lengths.clear()
        offsets = exclusive_cumsum(lengths)
        del lengths
        meta: dict[str, Any] = {}
        for k, chunks in self._meta.items():  # a column at a time, its chunks freed once joined
            joined = np.concatenate(chunks) if chunks else np.zeros(0, PER_EXAMPLE[k])
            chunks.clear()
            meta[k] = narrow(joined) if k in WIDE and not self.compact else joined
        if self.compact:
            offsets = narrow(offsets)
        counts = SpillCounts(
            sources=tuple(self._sources.names),
            domains=tuple(self._domains.names),
            formats=tuple(self._formats.names),
            records_per_source=tuple(self._per_source.tolist()),
            records_per_domain=tuple(self._per_domain.tolist()),
            tokens_in_per_domain=tuple(self._tokens_in.tolist()),
            **self._policy,
        )
        empty = np.zeros(0, np.int32)
        return Spill(
            tokens=empty,
            labels=empty,
            offsets=offsets,
            **meta,
            counts=counts,
            part_files=PartFiles((str(self.folder),), offsets[[0, -1]]),
        )
