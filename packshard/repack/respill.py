"""A parent pack's examples back into a spill, in example-id order, through the overlong policy.

``pack`` spills examples in input order and numbers them by that order; a parent's shards hold
the same examples shuffled into rows.  The index gives every example's length, so each one's
place in the spill is known before a shard is read, and one pass puts it there::

    index    num_tokens, num_loss_tokens by example id                    (in memory)
    every example fits the new max_seq_len (no --strategy wrapped): the common case
             the index alone is the spill (:func:`whole_spill`): pack plans it, then
    lay out  shards, a row group at a time (checked: SHA-256, columns, seams, lengths,
             targets), each segment copied to where the new plan puts it (a jitted scatter)
             ─► work/parent/tokens.bin, the labels folded in: the new shards' tokens, in
             their order, so each new row group is one contiguous read (:func:`lay_out`)
    else     pass 1 as above, but each example to its place by example id, then
             (--strategy wrapped: those files are the spill; its planner counts targets
             from the labels) or pass 2, in chunks of 65,536 examples, each one slice of
             those files ─► SpillWriter.add: the overlong policy, the counts ─► work/spill/…

The reading and scattering of the parent's shards is :mod:`packshard.repack.tokens`; pass 2,
when the policy has work, costs about 2 CPU-s more on 1,000,000 examples.

Each example's first label is -100 in the shards (packing masks it) and may have been a target
in the parent's spill; a plan never trains it and the counts skip it (``num_loss_tokens``), so
the output does not depend on it.  Examples the parent cut (split or truncated) are refused
before this runs (:func:`~packshard.repack.config.parent_problem`): their lost tokens and
masked part starts cannot be re-made.

Records the parent dropped as too long have no tokens in it; their rejects are carried, or
refused, by :mod:`packshard.repack.drops`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packshard.arrays import exclusive_cumsum, numpy_view
from packshard.errors import FormatError, UsageError
from packshard.format.examples import EXAMPLES_NAME, read_examples
from packshard.ingest.types import TokenizedBatch
from packshard.pack.config import PackConfig
from packshard.pack.plan.rows import RowPlan
from packshard.pack.spill import Spill, SpillCounts, SpillWriter, narrow
from packshard.pack.units.parts import PartFiles
from packshard.records import Reject, SourceRefs
from packshard.repack.drops import carried_rejects, with_drops
from packshard.repack.tokens import StoredTokens, lay_out, parent_tokens

CHUNK = 1 << 16
"""Examples per batch handed to the spill writer (pass 2)."""


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
    lay_out: Callable[[Spill, RowPlan], Spill] | None = None
    """Reads the parent's tokens into the planned order (:func:`lay_out`); None: in the spill."""


def _numbers(column: pa.ChunkedArray, kind: type = np.int64) -> np.ndarray:
    """Return a numeric column as one ``kind`` array, its chunks copied once, without pandas.

    Each chunk (a row group) is read where Arrow holds it (:func:`~packshard.arrays.numpy_view`)
    and widened as it is copied: no combined Arrow copy before a widened numpy one.
    """
    views = [numpy_view(chunk) for chunk in column.chunks]
    return np.concatenate(views, dtype=kind) if views else np.zeros(0, kind)


def _counts_up(column: pa.ChunkedArray) -> bool:
    """Tell whether a column holds ``0 … n-1`` in order, a chunk at a time."""
    at = 0
    for chunk in column.chunks:
        if not np.array_equal(numpy_view(chunk), np.arange(at, at + len(chunk))):
            return False
        at += len(chunk)
    return True


def respill(parent: Path, manifest: dict[str, Any], config: PackConfig, work: Path) -> Respilled:
    """Spill ``parent``'s examples under ``config``'s overlong policy into ``work``.

    Where every example fits whole (and ``--strategy`` is not ``wrapped``), the spill is the
    index's and the tokens are read later, by :attr:`Respilled.lay_out`, once pack has the plan.
    """
    sources = tuple(entry["path"] for entry in manifest["inputs"])
    carried, dropped = carried_rejects(parent, manifest, config)
    examples, lengths, targets = parent_examples(parent, manifest)
    by_format: dict[str, str] = manifest["loss"]["by_format"]
    mixed = len(set(by_format.values())) > 1
    if mixed and (problem := whole_examples_problem(lengths, config)) is not None:
        raise UsageError(f"{parent}: cannot repack: {problem}")
    formats = tuple(by_format)  # each example under formats[0]: its policy is all that counts
    fmt = formats[:1] or ("messages",)
    plan = config.plan
    wrapped = plan.strategy == "wrapped"
    rejects: list[Reject] = []
    later: Callable[[Spill, RowPlan], Spill] | None = None
    if not wrapped and (not lengths.size or int(lengths.max()) <= plan.max_seq_len):
        spill = whole_spill(exclusive_cumsum(lengths), narrow(targets), examples, fmt)
        later = partial(lay_out, parent, work / "parent", lengths, targets)
    else:
        stored = parent_tokens(parent, work / "parent", lengths, targets)
        if wrapped:  # its planner counts each cut's targets from the labels: read them first
            spill = whole_spill(
                stored.offsets, stored.loss_tokens, examples, fmt, stored.part_files
            )
        else:  # the overlong policy has work: pack's own spill writer does it
            spill, rejects = policed_spill(stored, examples, config, work / "spill", formats)
    counts = with_drops(spill.counts, dropped)
    spill = replace(spill, counts=replace(counts, formats=formats or counts.formats))
    order = {name: i for i, name in enumerate(sources)}
    merged = sorted(carried + rejects, key=lambda r: (order[r.ref.source], r.ref.line))
    by_policy = manifest["loss"]["examples_by_policy"] if mixed else None
    return Respilled(spill, merged, by_policy, later)


def parent_examples(
    parent: Path, manifest: dict[str, Any]
) -> tuple[Examples, np.ndarray, np.ndarray]:
    """Return what the parent's index says of each example, its length and targets (int64).

    The targets (``num_loss_tokens``) are the parent's, first label excluded: the shards are
    checked against them as they are read.
    """
    sources = tuple(entry["path"] for entry in manifest["inputs"])
    index = read_examples(
        parent / EXAMPLES_NAME,
        manifest["dataset_id"],
        ["example_id", "source", "line", "domain", "num_tokens", "num_loss_tokens"],
        dictionary=["source", "domain"],
    )
    if not _counts_up(index["example_id"]):
        raise FormatError(str(parent / EXAMPLES_NAME), "example ids are not 0 … n-1 in order")
    if index["source"].null_count or index["domain"].null_count:
        raise FormatError(str(parent / EXAMPLES_NAME), "an example has no source or domain")
    names, codes = _domains(index["source"])  # each name once, then a code per example
    position = {name: i for i, name in enumerate(sources)}
    if not set(names) <= position.keys():
        raise FormatError(str(parent / EXAMPLES_NAME), "a source is not among the inputs")
    to_input = np.array([position[name] for name in names], np.int32)
    examples = Examples(
        sources,
        to_input[codes],
        _numbers(index["line"]),
        *_domains(index["domain"]),
    )
    return examples, _numbers(index["num_tokens"]), _numbers(index["num_loss_tokens"])


@dataclass(frozen=True)
class Examples:
    """What the parent's index says of each example, by example id (all but its tokens)."""

    sources: tuple[str, ...]
    source_codes: np.ndarray  # int32, into ``sources``
    lines: np.ndarray  # int64
    domain_names: tuple[str, ...]  # in order of first appearance by example id
    domain_codes: np.ndarray  # int32, into ``domain_names``


def _domains(column: pa.ChunkedArray) -> tuple[tuple[str, ...], np.ndarray]:
    """Return a dictionary column's values in order of first appearance and each row's code.

    Each chunk (a row group) has a dictionary of its own; the codes are made one across them,
    in the order the spill writer gives its names (first appearance by example id).
    """
    names: list[str] = []
    code: dict[str, int] = {}
    out = []
    for chunk in column.chunks:
        local = chunk.dictionary.to_pylist()
        indices = numpy_view(chunk.indices)
        present, first = np.unique(indices, return_index=True)
        for name in (local[i] for i in present[np.argsort(first)].tolist()):
            if name not in code:
                code[name] = len(names)
                names.append(name)
        to_code = np.array([code.get(name, -1) for name in local], np.int32)
        out.append(to_code[indices])
    return tuple(names), np.concatenate(out) if out else np.zeros(0, np.int32)


def whole_spill(
    offsets: np.ndarray,
    loss_tokens: np.ndarray,
    examples: Examples,
    fmt: tuple[str, ...],
    part_files: PartFiles | None = None,
) -> Spill:
    """Return the spill the spill writer makes of examples when none is cut or dropped.

    The per-example arrays are the writer's for whole examples, each its own record (checked
    equal to :class:`~packshard.pack.spill.SpillWriter`'s).  ``part_files``: pass 1's files,
    the examples in id order; None where the tokens are laid out after planning.
    """
    n = len(offsets) - 1
    domain, names = examples.domain_codes, examples.domain_names
    tokens_in = _tokens_per_domain(domain, offsets, len(names))
    counts = SpillCounts(
        sources=examples.sources,
        domains=names,
        formats=fmt,
        records_per_source=tuple(
            np.bincount(examples.source_codes, minlength=len(examples.sources)).tolist()
        ),
        records_per_domain=tuple(np.bincount(domain, minlength=len(names)).tolist()),
        tokens_in_per_domain=tuple(tokens_in.astype(np.int64).tolist()),
    )
    empty = np.zeros(0, np.int32)
    return Spill(
        tokens=empty,
        labels=empty,
        offsets=offsets,
        loss_tokens=loss_tokens,
        source_index=examples.source_codes,
        lines=narrow(examples.lines),
        parts=np.zeros(n, np.int32),
        starts=np.zeros(n, np.int32),  # narrow's types, made so: no int64 copy first
        domain_codes=domain,
        truncated=np.zeros(n, np.bool_),
        record_ids=np.arange(n, dtype=np.int32 if n <= 2**31 else np.int64),
        format_codes=np.zeros(n, np.int8),
        counts=counts,
        turns=np.zeros(n, np.int32),
        pair_codes=np.zeros(n, np.int8),
        images=np.zeros(n, np.int32),
        part_files=part_files,
    )


def _tokens_per_domain(domain: np.ndarray, offsets: np.ndarray, count: int) -> np.ndarray:
    """Sum the examples' tokens per domain code (int64), a run of one code at a time.

    A run's tokens are a difference of two offsets, where a count weighted by every length
    would make each of them a float first (examples of one domain in id order: one run).
    """
    if len(domain) == 0:
        return np.zeros(count, np.int64)
    runs = np.flatnonzero(np.diff(domain)) + 1  # where a run of one code starts
    first = np.concatenate(([0], runs))
    sums = offsets[np.append(runs, len(domain))] - offsets[first]
    return np.bincount(domain[first], weights=sums, minlength=count).astype(np.int64)


def policed_spill(
    stored: StoredTokens,
    examples: Examples,
    config: PackConfig,
    folder: Path,
    formats: tuple[str, ...],
) -> tuple[Spill, list[Reject]]:
    """Pass 2: ``stored`` through pack's spill writer (the overlong policy), in chunks."""
    folder.mkdir()
    writer = SpillWriter(
        folder,
        config.plan.max_seq_len,
        config.plan.overlong,
        config.plan.strategy == "wrapped",
        examples.sources,
    )
    rejects: list[Reject] = []
    fmt = formats[:1] or ("messages",)
    names = examples.domain_names
    for lo in range(0, len(stored.length), CHUNK):
        hi = min(lo + CHUNK, len(stored.length))
        tokens, labels, offsets = stored.read(lo, hi)
        batch = TokenizedBatch(
            tokens,
            labels,
            offsets,
            SourceRefs(examples.sources, examples.source_codes[lo:hi], examples.lines[lo:hi]),
            tuple(names[c] for c in examples.domain_codes[lo:hi].tolist()),
            fmt * (hi - lo),
        )
        rejects += writer.add(batch)
    return writer.finish(), rejects


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
