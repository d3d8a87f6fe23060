"""A parent pack's examples back into a spill, in example-id order, through the overlong policy.

``pack`` spills examples in input order and numbers them by that order; a parent's shards hold
the same examples shuffled into rows.  Two passes give the spill a fresh ``pack`` of the same
inputs would have made, without a tokenizer::

    pass 1  shards, in file order ─► work/parent/tokens.bin, labels.bin    (as stored)
            per segment: example_id, flat start, length                (int64, in memory)
    pass 2  example ids 0, 1, 2 … in chunks of 65,536:
            gather their ranges from pass 1 (a memory map, a jitted copy) ─► TokenizedBatch
            ─► SpillWriter.add: the overlong policy of the *new* max_seq_len, the counts
            ─► work/spill/tokens.bin, labels.bin                        (pack's own spill)

Measured on 1,000,000 chat examples (23.0M phi-3 tokens, ``scripts/bench_repack.py``, one
process on a loaded 2-core machine): pass 1 2.4 CPU-s (reading and checking the shards), pass 2
2.4 (the examples index, the gathers, the spill writer); pack's ingest of the same records
takes minutes.

Each example's first label is -100 in the shards (packing masks it) and may have been a target
in the parent's spill; a plan never trains it and the counts skip it (``num_loss_tokens``), so
the output does not depend on it.  Examples the parent cut (split or truncated) are refused
before this runs (:func:`~packshard.repack.config.parent_problem`): their lost tokens and
masked part starts cannot be re-made.

Records the parent dropped as too long (code ``too_long``) have no tokens in it.  They stay
dropped where a fresh pack would drop them too (``--overlong drop`` and longer than the new
``max_seq_len``, their length read from the reject's reason); the reject is rewritten to name
the new ``max_seq_len`` and the records count among those read, as a fresh pack counts them.
Where a fresh pack would keep one, the repack stops and names it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packshard.arrays import add_counts, arrow_strings, exclusive_cumsum, numpy_view
from packshard.errors import FormatError, UsageError
from packshard.export.common import COLUMNS, read_rows
from packshard.format.examples import EXAMPLES_NAME, read_examples
from packshard.format.rejects import REJECTS_NAME, read_rejects
from packshard.ingest.types import TokenizedBatch
from packshard.pack.config import PackConfig
from packshard.pack.spill import Spill, SpillCounts, SpillWriter
from packshard.pack.units.parts import FILES, gather_ranges
from packshard.records import Reject, SourceRefs

CHUNK = 1 << 16
"""Examples per batch handed to the spill writer (pass 2)."""

_TOO_LONG = re.compile(r"is (\d+) tokens > max_seq_len (\d+) \(dropped")


@dataclass(frozen=True)
class Respilled:
    """The spill and every reject so far, in (input, line) order.

    ``examples_by_policy`` is the parent's count of examples per loss policy when its formats
    train under several (the index does not say which example had which, so every example
    must stay whole: :func:`whole_examples_problem`); None when one policy covers them all.
    """

    spill: Spill
    rejects: list[Reject]
    examples_by_policy: dict[str, int] | None = None


def _numbers(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Return a numeric column as numpy without pandas (:func:`~packshard.arrays.numpy_view`)."""
    whole = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return numpy_view(whole)


def respill(parent: Path, manifest: dict[str, Any], config: PackConfig, work: Path) -> Respilled:
    """Spill ``parent``'s examples under ``config``'s overlong policy into ``work``."""
    sources = tuple(entry["path"] for entry in manifest["inputs"])
    carried, dropped = _carried_rejects(parent, manifest, config)
    index = read_examples(
        parent / EXAMPLES_NAME,
        manifest["dataset_id"],
        ["example_id", "source", "line", "domain"],
    )
    ids = _numbers(index["example_id"])  # numpy_view: to_numpy would import pandas
    if not np.array_equal(ids, np.arange(len(ids))):
        raise FormatError(str(parent / EXAMPLES_NAME), "example ids are not 0 … n-1 in order")
    found = pc.index_in(index["source"], value_set=arrow_strings(sources))
    if found.null_count:
        raise FormatError(str(parent / EXAMPLES_NAME), "a source is not among the inputs")
    source_codes = _numbers(found)
    encoded = index["domain"].combine_chunks().dictionary_encode()
    domain_names = encoded.dictionary.to_pylist()  # in order of first appearance
    domain = numpy_view(encoded.indices)
    lines = _numbers(index["line"])
    del index, encoded
    stored = parent_tokens(parent, work / "parent", len(ids))
    by_format: dict[str, str] = manifest["loss"]["by_format"]
    mixed = len(set(by_format.values())) > 1
    if mixed and (problem := whole_examples_problem(stored.length, config)) is not None:
        raise UsageError(f"{parent}: cannot repack: {problem}")
    formats = tuple(by_format)  # each example under formats[0]: its policy is all that counts
    (work / "spill").mkdir()
    writer = SpillWriter(
        work / "spill",
        config.plan.max_seq_len,
        config.plan.overlong,
        config.plan.strategy == "wrapped",
        sources,
    )
    rejects: list[Reject] = []
    fmt = formats[:1] or ("messages",)
    codes = source_codes.astype(np.int32)
    for lo in range(0, len(ids), CHUNK):
        hi = min(lo + CHUNK, len(ids))
        tokens, labels, offsets = stored.read(lo, hi)
        batch = TokenizedBatch(
            tokens,
            labels,
            offsets,
            SourceRefs(sources, codes[lo:hi], lines[lo:hi]),
            tuple(domain_names[c] for c in domain[lo:hi].tolist()),
            fmt * (hi - lo),
        )
        rejects += writer.add(batch)
    spill = writer.finish()
    counts = _with_drops(spill.counts, dropped)
    spill = replace(spill, counts=replace(counts, formats=formats or counts.formats))
    order = {name: i for i, name in enumerate(sources)}
    merged = sorted(carried + rejects, key=lambda r: (order[r.ref.source], r.ref.line))
    by_policy = manifest["loss"]["examples_by_policy"] if mixed else None
    return Respilled(spill, merged, by_policy)


def whole_examples_problem(lengths: np.ndarray, config: PackConfig) -> str | None:
    """Return why the new options would not keep every example whole as one segment, or None.

    Needed where the parent's record formats train under several loss policies: the manifest
    counts its examples per policy, and those counts stay true only if none is dropped or cut.
    """
    plan = config.plan
    over = int(np.count_nonzero(lengths > plan.max_seq_len))
    if plan.strategy != "wrapped" and not over:
        return None
    why = (
        "--strategy wrapped cuts examples at row ends"
        if plan.strategy == "wrapped"
        else f"{over} examples are longer than --max-seq-len {plan.max_seq_len} "
        f"(--overlong {plan.overlong})"
    )
    return (
        f"its record formats train under different loss policies and the examples index does "
        f"not say which example had which, so every example must stay whole; {why} (keep "
        "--max-seq-len at least the longest example, or pack from the inputs)"
    )


@dataclass(frozen=True)
class StoredTokens:
    """The parent's tokens as stored (pass 1), read back by example id."""

    folder: Path
    start: np.ndarray  # int64 per example id: flat start in the stored files
    length: np.ndarray  # int64 per example id

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return the tokens, labels and offsets of examples ``lo … hi - 1``, in id order."""
        length = self.length[lo:hi]
        offsets = exclusive_cumsum(length)
        out = []
        for name in FILES:
            path = self.folder / name
            values = np.empty(int(offsets[-1]), np.int32)
            if values.size:
                stored = np.memmap(path, dtype=np.int32, mode="r")
                gather_ranges(stored, self.start[lo:hi], length, offsets[:-1], values)
                del stored
            out.append(values)
        return out[0], out[1], offsets


def parent_tokens(parent: Path, folder: Path, examples: int) -> StoredTokens:
    """Pass 1: write every shard's tokens and labels into ``folder``; index them by example id.

    Every shard is checked as it is read (its SHA-256, dataset id, columns and seams:
    :func:`packshard.export.common.read_rows`), and every example id must appear once.
    """
    folder.mkdir(parents=True)
    start = np.full(examples, -1, np.int64)
    length = np.zeros(examples, np.int64)
    at = 0
    handles = [open(folder / name, "wb") for name in FILES]
    try:
        for rows in read_rows(parent, ("train", "eval"), COLUMNS):
            for fh, values in zip(handles, (rows.ids, rows.labels), strict=True):
                fh.write(np.ascontiguousarray(values, np.int32).data)
            ids = rows.example_ids
            if ids.size and (ids.min() < 0 or ids.max() >= examples or (start[ids] >= 0).any()):
                raise FormatError(str(parent), "an example id is repeated or not in the index")
            start[ids] = at + rows.seg_starts()
            length[ids] = rows.seg_len
            at += len(rows.ids)
    finally:
        for fh in handles:
            fh.close()
    if (start < 0).any():
        missing = int(np.flatnonzero(start < 0)[0])
        raise FormatError(str(parent), f"example {missing} of the index is in no shard")
    return StoredTokens(folder, start, length)


def _carried_rejects(
    parent: Path, manifest: dict[str, Any], config: PackConfig
) -> tuple[list[Reject], list[tuple[Reject, int]]]:
    """Return the parent's rejects as a fresh pack under ``config`` writes them.

    Also returns the ``too_long`` drops with their lengths (records the spill writer never
    sees).  A drop that a fresh pack would keep is refused.
    """
    plan = config.plan
    carried: list[Reject] = []
    dropped: list[tuple[Reject, int]] = []
    for reject in read_rejects(parent / REJECTS_NAME):
        if reject.code != "too_long":
            carried.append(reject)
            continue
        found = _TOO_LONG.search(reject.reason)
        if found is None:
            raise FormatError(str(parent / REJECTS_NAME), f"{reject.ref}: no length in its reason")
        length = int(found.group(1))
        if plan.overlong == "error" and plan.strategy != "wrapped":
            raise UsageError(
                f"{reject.ref}: the parent dropped this {length}-token record as too long; "
                "under --overlong error a fresh pack would stop there (use --overlong drop)"
            )
        kept = plan.strategy == "wrapped" or plan.overlong != "drop"
        if kept or length <= plan.max_seq_len:
            how = f"--overlong {plan.overlong}" if plan.overlong != "drop" else "it fits"
            if plan.strategy == "wrapped":
                how = "--strategy wrapped splits it"
            raise UsageError(
                f"{reject.ref}: the parent dropped this {length}-token record as too long, and "
                f"with --max-seq-len {plan.max_seq_len} a fresh pack would keep it ({how}); "
                "its tokens are not in the parent (pack from the inputs, or keep --overlong "
                "drop with a --max-seq-len below its length)"
            )
        old = f"> max_seq_len {found.group(2)} (dropped"
        reason = reject.reason.replace(old, f"> max_seq_len {plan.max_seq_len} (dropped")
        fresh = Reject(reject.ref, reject.domain, reject.code, reason)
        carried.append(fresh)
        dropped.append((fresh, length))
    return carried, dropped


def _with_drops(counts: SpillCounts, dropped: list[tuple[Reject, int]]) -> SpillCounts:
    """Count the carried drops as records read, per source and domain, with their tokens."""
    per_source = np.zeros(len(counts.sources), np.int64)
    code = {name: i for i, name in enumerate(counts.sources)}
    domains = list(counts.domains)
    for reject, _ in dropped:
        if reject.domain not in domains:
            domains.append(reject.domain)
    per_domain = np.zeros((2, len(domains)), np.int64)  # records, tokens
    for reject, length in dropped:
        per_source[code[reject.ref.source]] += 1
        per_domain[:, domains.index(reject.domain)] += (1, length)
    return replace(
        counts,
        domains=tuple(domains),
        records_per_source=tuple((np.asarray(counts.records_per_source) + per_source).tolist()),
        records_per_domain=tuple(
            add_counts(np.asarray(counts.records_per_domain), per_domain[0]).tolist()
        ),
        tokens_in_per_domain=tuple(
            add_counts(np.asarray(counts.tokens_in_per_domain), per_domain[1]).tolist()
        ),
    )
