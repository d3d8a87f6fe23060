"""The driver's merge: the work units' results become one spill and one ordered rejects list.

Units come back in unit order (engines keep task order), each with numbers that are only
local: lines counted from its byte range's start, domain and format codes of its own,
record ids from 0.  The merge makes them what one process reading every input would have
made::

    unit        lines (relative)   + lines before it in its file   = lines (absolute)
    unit        input              its split's input index (a unit reads one input)
    unit        domain codes       ─► names ─► codes in order of first appearance overall
    unit        record ids         + records accepted by earlier units
    unit        tokens             laid after the earlier units' (PartFiles bases)

Rejects are put in (input, line) order: units come in input order and byte order, so a
stable sort of each unit's rejects by line (what ingest rejected and what the overlong
policy dropped are interleaved by record; a record's own rejects keep their order) gives
the order of the whole job, whatever the unit size or the chunk size.  A split that
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
from packshard.pack.spill import PER_EXAMPLE, Spill, SpillCounts
from packshard.pack.units.map import UnitResult
from packshard.pack.units.parts import PartFiles
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
    results: Sequence[UnitResult], sources: tuple[str, ...]
) -> tuple[Spill, list[Reject]]:
    """Return the merged spill (tokens in the parts) and the rejects in (input, line) order.

    Raises:
        RecordError: the first unit error in input order (``--on-error fail``,
            ``--overlong error``), at its absolute line.

    """
    units = kept_units(results)
    domains, formats = NameCodes(), NameCodes()
    line_base = [0] * len(sources)
    meta: dict[str, list[np.ndarray]] = {k: [] for k in (*PER_EXAMPLE, "lengths")}
    rejects: list[Reject] = []
    per_source = np.zeros(len(sources), np.int64)
    per_domain = tokens_in = np.zeros(0, np.int64)
    policy = {"tokens_truncated": 0, "records_split": 0, "parts_dropped": 0}
    accepted = 0
    for r in units:
        base = line_base[r.split.index] if r.split.kind == "bytes" else 0
        line_base[r.split.index] += r.newlines
        if r.error is not None:
            code, reason, source, line = r.error
            raise RecordError(code, reason, source, line + base)
        a = r.arrays
        dom = domains.encode(r.domains)
        fmt = formats.encode(r.formats)
        for key in PER_EXAMPLE:
            meta[key].append(a[key])
        meta["lengths"].append(a["lengths"])
        meta["lines"][-1] = a["lines"] + base
        meta["source_index"][-1] = np.full_like(a["source_index"], r.split.index)  # its one input
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
        rejects += sorted((_moved(x, base) for x in r.rejects), key=_line)
        accepted += int(a["record_lines"].shape[0])
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
        k: np.concatenate([np.zeros(0, PER_EXAMPLE.get(k, np.int64)), *v]) for k, v in meta.items()
    }
    lengths = joined.pop("lengths").astype(np.int64)
    for k, dtype in PER_EXAMPLE.items():
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
    return spill, rejects


def _moved(reject: Reject, base: int) -> Reject:
    ref = SourceRef(reject.ref.source, reject.ref.line + base)
    return Reject(ref, reject.domain, reject.code, reject.reason)


def _line(reject: Reject) -> int:
    return reject.ref.line


def _by_code(codes: np.ndarray, values: Sequence[int], n: int) -> np.ndarray:
    out = np.zeros(n, np.int64)
    np.add.at(out, codes, np.asarray(values, np.int64))
    return out
