"""The source check on an engine: the inputs re-ingested unit by unit, by workers.

Re-ingesting every input (render, tokenize, label) is the costly part of ``verify``.  The
inputs are cut into the same units as ``pack`` (:mod:`packshard.ingest.read.units`) and
each task re-ingests one, on the engine ``--workers`` / ``--engine`` name (``--workers 1``:
in this process, on the driver's tokenizer and template)::

    driver: count the lines of every byte range (cheap reads) ─► absolute lines
            hand each unit the examples of its records: (line, token offset, length, index row)
    worker: run_unit into a DigestSink: digest each example's slice of the ids and labels
            (the first masked); return digests and the lines accepted and rejected
    driver: digest each packed segment and compare: the findings of the one-process check

Only digests come back, never tokens.  ``--sample K`` draws its records with the seed, the
same draw whatever the engine.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packshard.engine import EngineOptions, open_engine, worker_cores
from packshard.format.examples import ExamplesIndex
from packshard.format.shards import read_row
from packshard.ingest import (
    ChatTemplate,
    InputFile,
    TokenizerBundle,
    UnitRead,
    UnitResult,
    UnitTask,
    WorkUnit,
    count_newlines,
    in_order,
    open_progress,
    plan_ranges,
    run_unit,
)
from packshard.ingest.types import IngestChunk, StageSpec
from packshard.records import IGNORE_INDEX, PackedRow
from packshard.verify.findings import Finding, FindingList
from packshard.verify.turns import TurnCheck, turn_check


@dataclass(frozen=True, slots=True)
class DigestSink:
    """The packed examples of one unit's records, to digest as the unit is re-ingested."""

    line_base: int
    lines: np.ndarray  # int64, sorted: the record line of each example below
    offsets: np.ndarray  # token_offset of each example
    lengths: np.ndarray  # num_tokens of each example
    positions: np.ndarray  # row of each example in the examples index
    turns: np.ndarray  # int64, the --turns expand message of each example (0: the whole record)
    label_spans: str | None = None  # the manifest's, for the turn check
    branches: np.ndarray | None = None  # int8, 1 chosen / 2 rejected of each example (pairs)

    @contextmanager
    def open(
        self,
        unit: WorkUnit,
        spec: StageSpec,
        bundle: TokenizerBundle,
        template: ChatTemplate | None,
    ) -> Iterator[DigestWriter]:
        """Digest the unit's examples (the turn check run on each, where it applies)."""
        check = turn_check(template, bundle, spec.options, self.label_spans)
        split = unit.ranges[0]
        shift = self.line_base if split.kind == "bytes" else 0
        yield DigestWriter(self, split.path, shift, bundle, check)


@dataclass(frozen=True, slots=True)
class UnitDigests:
    """What a re-ingested unit sends back: digests and lines, never tokens."""

    positions: np.ndarray  # int64: index rows compared
    lengths: np.ndarray  # int64: their re-ingested lengths
    ids: list[bytes]  # digest of each one's ids
    labels: list[bytes]  # digest of each one's labels, the first masked
    accepted: np.ndarray  # int64: absolute lines of the records ingest accepted
    rejected: np.ndarray  # int64: absolute lines of those it rejected
    findings: FindingList
    checked: dict[str, int]  # the turn check's counts


@dataclass(slots=True)
class DigestWriter:
    """One unit's digests, gathered chunk by chunk."""

    sink: DigestSink
    path: str
    shift: int
    bundle: TokenizerBundle
    check: TurnCheck | None
    found: FindingList = field(default_factory=FindingList)
    out_pos: list[int] = field(default_factory=list)
    out_len: list[int] = field(default_factory=list)
    dig_ids: list[bytes] = field(default_factory=list)
    dig_labels: list[bytes] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)

    def add(self, chunk: IngestChunk) -> None:
        """Digest the slices of ``chunk``'s examples that were packed."""
        task, shift, check = self.sink, self.shift, self.check
        self.rejected += [r.ref.line + shift for r in chunk.rejects]
        batch = chunk.batch
        for i, ref in enumerate(batch.refs):
            line = ref.line + shift
            self.accepted.append(line)
            lo = int(np.searchsorted(task.lines, line, "left"))
            hi = int(np.searchsorted(task.lines, line, "right"))
            if lo == hi:
                continue
            ids, labels = batch.example(i)
            turn = int(batch.turns[i]) if batch.turns is not None else 0
            branch = int(batch.pairs[i]) if batch.pairs is not None else 0
            branch = branch if branch <= 2 else 0  # KTO codes 3, 4: one example a record
            if check is not None:
                place = f"{self.path}:{line}"
                check.example(self.bundle.tokenizer, ids, labels, place, turn, self.found)
            for k in range(lo, hi):
                if int(task.turns[k]) != turn:
                    continue
                if task.branches is not None and int(task.branches[k]) != branch:
                    continue
                offset, n = int(task.offsets[k]), int(task.lengths[k])
                want_ids = ids[offset : offset + n]
                want_labels = labels[offset : offset + n].copy()
                if len(want_labels):
                    want_labels[0] = IGNORE_INDEX
                self.out_pos.append(int(task.positions[k]))
                self.out_len.append(len(want_ids))
                self.dig_ids.append(digest(want_ids))
                self.dig_labels.append(digest(want_labels))

    def finish(self, read: UnitRead) -> UnitDigests:
        """Return the unit's digests and lines."""
        return UnitDigests(
            positions=np.array(self.out_pos, np.int64),
            lengths=np.array(self.out_len, np.int64),
            ids=self.dig_ids,
            labels=self.dig_labels,
            accepted=np.array(self.accepted, np.int64),
            rejected=np.array(self.rejected, np.int64),
            findings=self.found,
            checked=self.check.counts() if self.check is not None else {},
        )


def digest(values: np.ndarray) -> bytes:
    """16-byte digest of an int32 array's bytes."""
    return hashlib.blake2b(np.asarray(values, np.int32).tobytes(), digest_size=16).digest()


def source_unit(task: UnitTask[DigestSink]) -> UnitResult[UnitDigests]:
    """Re-ingest one unit and digest the slices of its packed examples (runs in a worker)."""
    return run_unit(task, worker_cores())


def reingest_on_engine(
    files: Sequence[InputFile],
    stage: StageSpec,
    label_spans: str | None,
    index: Any,
    chosen: np.ndarray,
    engine: EngineOptions,
    progress: bool = False,
) -> list[UnitResult[UnitDigests]]:
    """Run :func:`source_unit` over every unit, in order; ``chosen`` masks the index rows.

    A unit's packed examples are found by their lines.

    Raises:
        RecordError: the first unit error in input order.

    """
    ranges = plan_ranges(files)
    with open_engine(engine) as running:
        cut = [s for s in ranges if s.kind == "bytes"]
        counts = running.run(count_newlines, cut, [s.describe() for s in cut])
        newlines = dict(zip(cut, counts, strict=True))
        code_of = {name: code for code, name in enumerate(index.source_names)}
        base = [0] * len(files)
        tasks = []
        for k, s in enumerate(ranges):
            first = s.first_row if s.kind == "rows" else base[s.index]
            mine = chosen & (index.source_code == code_of.get(s.path, -1))
            if s.kind == "bytes":
                base[s.index] += newlines[s]
                mine &= (index.lines > first) & (index.lines <= first + newlines[s] + 1)
            elif s.kind == "rows":
                later = [t.first_row for t in ranges[k + 1 :] if t.index == s.index]
                mine &= (index.lines > first) & (index.lines <= (later[0] if later else 2**62))
            pos = np.flatnonzero(mine)
            pos = pos[np.argsort(index.lines[pos], kind="stable")]
            turns = index.turns[pos] if index.turns is not None else np.zeros(len(pos))
            sink = DigestSink(
                first,
                lines=index.lines[pos].astype(np.int64),
                offsets=index.token_offset[pos].astype(np.int64),
                lengths=index.num_tokens[pos].astype(np.int64),
                positions=pos,
                turns=turns.astype(np.int64),
                label_spans=label_spans,
                branches=index.branches[pos] if index.branches is not None else None,
            )
            tasks.append(UnitTask(stage, WorkUnit((s,)), sink))
        bar = open_progress(progress, sum(s.size for s in ranges))

        def done(i: int, r: UnitResult[UnitDigests]) -> None:
            if bar is not None:
                records = len(r.value.accepted) + len(r.value.rejected)
                bar.add(records, int(r.value.lengths.sum()), ranges[i].size)

        try:
            results = running.run(source_unit, tasks, [s.describe() for s in ranges], done)
        finally:
            if bar is not None:
                bar.close()
    # the digests' lines are absolute already (the findings name them in the worker): the
    # driver's pass keeps the order and raises the first error
    return [r for r, _ in in_order(results, len(files))]


def compare_units(
    units: list[UnitResult[UnitDigests]],
    tables: dict[int, Any],
    manifest: dict[str, Any],
    index: Any,
    packed: set[tuple[str, int]],
    rejected: set[tuple[str, int]],
    findings: FindingList,
    cause: str = "",
) -> tuple[int, dict[str, int]]:
    """Turn the units' results into findings, in unit order.

    Returns the examples compared and the turn check's counts.  ``cause`` (the drifted
    libraries, or '') ends the findings of changed records and segments.
    """
    seen: set[tuple[str, int]] = set()
    compared = 0
    checked: Counter[str] = Counter()
    rows: dict[tuple[int, int], PackedRow] = {}

    def place(key: tuple[str, int]) -> str:
        return f"{key[0]}:{key[1]}"

    for unit in units:
        split, r = unit.unit.ranges[0], unit.value
        findings.extend(r.findings)
        checked.update(r.checked)
        for line in r.rejected.tolist():
            key = (split.path, line)
            seen.add(key)
            if key not in rejected:
                why = "record rejected on re-ingest but not in rejects.jsonl" + cause
                findings.add(Finding("source", why, source=place(key)), "reject_missing")
        for line in r.accepted.tolist():
            key = (split.path, line)
            seen.add(key)
            if key not in packed and key not in rejected:
                why = "record is neither packed nor in rejects.jsonl" + cause
                findings.add(Finding("source", why, source=place(key)), "record_missing")
        for k, pos in enumerate(r.positions.tolist()):
            want = (int(r.lengths[k]), r.ids[k], r.labels[k])
            compared += _compare_digest(tables, manifest, index, pos, want, rows, findings, cause)
    for key in sorted(packed - seen):
        why = "packed example has no record in the inputs"
        findings.add(Finding("source", why, source=place(key)), "invented")
    return compared, checked


def _compare_digest(
    tables: dict[int, Any],
    manifest: dict[str, Any],
    index: ExamplesIndex,
    pos: int,
    want: tuple[int, bytes, bytes],
    rows: dict[tuple[int, int], PackedRow],
    findings: FindingList,
    cause: str,
) -> bool:
    """Compare index row ``pos``'s packed segment with its re-ingested example's digests.

    False when the segment cannot be read: a missing shard (already an integrity finding), a
    row past the shard's end, an example id not in its row or a segment its row's
    ``cu_seqlens`` do not hold (findings here).
    """
    shard, row = int(index.shard[pos]), int(index.row[pos])
    eid = int(index.example_id[pos])
    where = index.where(eid)
    if shard not in tables:
        return False
    name = manifest["shards"][shard]["path"]
    if (shard, row) not in rows:
        if row >= tables[shard].num_rows:
            why = "examples.parquet points past the shard's last row"
            findings.add(Finding("source", why, name, row, None, eid, where))
            return False
        rows[(shard, row)] = read_row(tables[shard], row)
    packed = rows[(shard, row)]
    segs = np.flatnonzero(packed.example_ids == eid)
    if segs.size != 1:
        why = "example id not found in its row"
        findings.add(Finding("source", why, name, row, None, eid, where))
        return False
    seg = int(segs[0])

    def bad(message: str, because: str = "") -> None:
        findings.add(Finding("source", message + because, name, row, seg, eid, where), message[:20])

    cu = packed.cu_seqlens
    if seg + 1 >= len(cu) or not 0 <= int(cu[seg]) <= int(cu[seg + 1]) <= len(packed.input_ids):
        bad("its row's cu_seqlens do not hold this segment (see structure)")
        return False
    lo, hi = int(cu[seg]), int(cu[seg + 1])
    n, ids, labels = want
    if n != hi - lo or digest(packed.input_ids[lo:hi]) != ids:
        bad("token ids differ from the source example re-tokenized", cause)
    elif digest(packed.labels[lo:hi]) != labels:
        bad("labels differ from the source example's (loss policy not preserved)", cause)
    if not np.array_equal(packed.position_ids[lo:hi], np.arange(hi - lo)):
        bad("positions differ from the example's positions alone")
    return True
