"""The driver's merge: the work units' results become one spill and one ordered rejects list.

Units come back in unit order (engines keep task order), each with numbers that are only
local: lines counted from its byte range's start, domain and format codes of its own,
record ids from 0.  The merge makes them what one process reading every input would have
made::

    unit        lines (relative)   + lines before it in its file   = lines (absolute)
    unit        domain codes       ─► names ─► codes in order of first appearance overall
    unit        record ids         + records accepted by earlier units
    unit        tokens             laid after the earlier units' (PartFiles bases)

Rejects are put in the order the single-process pipeline writes them: chunk by chunk of
``batch_size`` records counted over all inputs, and within a chunk first what ingest
rejected, then what the overlong policy dropped, each by record.  A record's place in that
count comes from its line: lines are unique and increasing within a split.  A split that
broke off reading (``stopped``) ends its file: the file's later units are left out, as
reading the whole file would have stopped there.  With ``--on-error fail`` the first unit
(in input order) holding an error raises it, placed at its absolute line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from packshard.arrays import NameCodes, add_counts, exclusive_cumsum
from packshard.errors import RecordError
from packshard.pack.parts import PartFiles
from packshard.pack.spill import _META, Spill, SpillCounts
from packshard.pack.units import STAGE_INGEST, UnitResult
from packshard.records import Reject, SourceRef


def kept_units(results: Sequence[UnitResult]) -> list[UnitResult]:
    """Leave out the units of a file after one of its units stopped reading."""
    stopped: set[int] = set()
    kept = []
    for r in results:
        if r.split.index in stopped:
            continue
        kept.append(r)
        if r.stopped:
            stopped.add(r.split.index)
    return kept


def merge_units(
    results: Sequence[UnitResult], sources: tuple[str, ...], batch_size: int
) -> tuple[Spill, list[Reject]]:
    """Return the merged spill (tokens in the parts) and the rejects in pipeline order.

    Raises:
        RecordError: the first unit error in input order (``--on-error fail``,
            ``--overlong error``), at its absolute line.

    """
    units = kept_units(results)
    domains, formats = NameCodes(), NameCodes()
    line_base = [0] * len(sources)
    meta: dict[str, list[np.ndarray]] = {k: [] for k in (*_META, "lengths")}
    keys: list[tuple[int, int, int]] = []
    rejects: list[Reject] = []
    per_source = np.zeros(len(sources), np.int64)
    per_domain = tokens_in = np.zeros(0, np.int64)
    policy = {"tokens_truncated": 0, "records_split": 0, "parts_dropped": 0}
    seq = accepted = 0
    for r in units:
        base = line_base[r.split.index] if r.split.kind == "bytes" else 0
        line_base[r.split.index] += r.newlines
        if r.error is not None:
            code, reason, source, line = r.error
            raise RecordError(code, reason, source, line + base)
        a = r.arrays
        dom = domains.encode(r.domains)
        fmt = formats.encode(r.formats)
        for key in _META:
            meta[key].append(a[key])
        meta["lengths"].append(a["lengths"])
        meta["lines"][-1] = a["lines"] + base
        meta["domain_codes"][-1] = dom[a["domain_codes"]] if len(dom) else a["domain_codes"]
        meta["format_codes"][-1] = (
            fmt[a["format_codes"]] if len(fmt) else a["format_codes"]
        ).astype(np.int8)
        meta["record_ids"][-1] = a["record_ids"] + accepted
        c = r.counts
        per_source[r.split.index] += sum(c.records_per_source)  # a unit reads one input
        n = len(domains.names)
        per_domain = add_counts(per_domain, _by_code(dom, c.records_per_domain, n))
        tokens_in = add_counts(tokens_in, _by_code(dom, c.tokens_in_per_domain, n))
        for k in policy:
            policy[k] += getattr(c, k)
        keys += _reject_keys(r, seq, batch_size)
        rejects += [_moved(x, base) for x in r.rejects]
        seq += r.records
        accepted += int(a["record_lines"].shape[0])
    order = sorted(range(len(rejects)), key=keys.__getitem__)
    ndom = len(domains.names)
    counts = SpillCounts(
        sources=sources,
        domains=tuple(domains.names),
        formats=tuple(formats.names),
        records_per_source=tuple(per_source.tolist()),
        records_per_domain=tuple(add_counts(per_domain, np.zeros(ndom, np.int64)).tolist()),
        tokens_in_per_domain=tuple(add_counts(tokens_in, np.zeros(ndom, np.int64)).tolist()),
        **policy,
    )
    joined: dict[str, Any] = {
        k: np.concatenate([np.zeros(0, _META.get(k, np.int64)), *v]) for k, v in meta.items()
    }
    lengths = joined.pop("lengths").astype(np.int64)
    for k, dtype in _META.items():
        joined[k] = joined[k].astype(dtype, copy=False)
    parts = PartFiles(
        tuple(r.folder for r in units),
        exclusive_cumsum(np.array([r.tokens for r in units], np.int64)),
    )
    empty = np.zeros(0, np.int32)
    spill = Spill(
        tokens=empty,
        labels=empty,
        offsets=exclusive_cumsum(lengths),
        **joined,
        counts=counts,
        part_files=parts,
    )
    return spill, [rejects[i] for i in order]


def _moved(reject: Reject, base: int) -> Reject:
    ref = SourceRef(reject.ref.source, reject.ref.line + base)
    return Reject(ref, reject.domain, reject.code, reject.reason)


def _by_code(codes: np.ndarray, values: Sequence[int], n: int) -> np.ndarray:
    out = np.zeros(n, np.int64)
    np.add.at(out, codes, np.asarray(values, np.int64))
    return out


def _reject_keys(r: UnitResult, seq: int, batch_size: int) -> list[tuple[int, int, int]]:
    """``(chunk, stage, record)`` of each reject: where the one-process pipeline writes it."""
    stage = r.arrays["reject_stage"]
    ingest_lines = [
        x.ref.line for x, s in zip(r.rejects, stage.tolist(), strict=True) if s == STAGE_INGEST
    ]
    lines = np.sort(np.concatenate([r.arrays["record_lines"], np.array(ingest_lines, np.int64)]))
    assert lines.shape[0] == r.records, "every record of a unit has a line of its own"
    place = np.searchsorted(lines, [x.ref.line for x in r.rejects]) + seq  # 0-based record
    return [
        (int(p) // batch_size, int(s), int(p))
        for p, s in zip(place.tolist(), stage.tolist(), strict=True)
    ]
