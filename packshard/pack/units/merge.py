"""The driver's merge: the work units' results become one spill and one ordered rejects list.

Units come back in unit order (engines keep task order), each with numbers that are only
local: lines counted from its byte range's start, domain and format codes of its own,
record ids from 0.  The merge makes them what one process reading every input would have
made::

    unit        lines (relative)   + lines before it in its file   = lines (absolute)
    unit        source codes       ─► its ranges' input indices (one range, or whole inputs)
    unit        domain codes       ─► names ─► codes in order of first appearance overall
    unit        record ids         + records accepted by earlier units
    unit        tokens             laid after the earlier units' (PartFiles bases)

The driver holds one unit's arrays at a time (read back from its folder,
:func:`~packshard.pack.units.stored.unit_arrays`) and fills merged columns in their smallest
types, widened only when a unit's values outgrow them (:data:`START`); the token offsets
are int32 while the tokens fit.  Merged, the columns go to files
(:mod:`packshard.pack.units.columns`).

Rejects are put in (input, line) order: units come in input and byte order, so a stable sort
of each unit's rejects by (input, line) gives the whole job's order, whatever the unit or
chunk size.  With ``--on-error fail`` the first unit holding an error raises it, at its
absolute line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from packshard.arrays import NameCodes, add_counts, exclusive_cumsum
from packshard.ingest import in_order
from packshard.pack.spill import PER_EXAMPLE, Spill, SpillCounts, narrow, smallest
from packshard.pack.units.parts import PartFiles
from packshard.pack.units.stored import MappedUnit, unit_arrays, unit_examples
from packshard.records import Reject, SourceRef


def merge_units(
    results: Sequence[MappedUnit], sources: tuple[str, ...]
) -> tuple[Spill, list[Reject]]:
    """Return the merged spill (tokens in the parts) and the rejects in (input, line) order.

    Raises:
        RecordError: the first unit error in input order (``--on-error fail``,
            ``--overlong error``), at its absolute line.

    """
    domains, formats = NameCodes(), NameCodes()
    total = sum(unit_examples(r) for r in results)
    meta: dict[str, np.ndarray] = {k: np.empty(total, _first_kind(k, d)) for k, d in START.items()}
    meta["source_index"] = np.empty(total, smallest(np.array([0, len(sources)])).dtype)
    tokens = np.zeros(len(results), np.int64)
    at = 0
    rejects: list[Reject] = []
    per_source = np.zeros(len(sources), np.int64)
    per_domain = tokens_in = np.zeros(0, np.int64)
    policy = {"tokens_truncated": 0, "records_split": 0, "parts_dropped": 0}
    accepted = 0
    for unit, (r, base) in enumerate(in_order(results, len(sources))):  # first error raised
        inputs = np.fromiter((s.index for s in r.unit.ranges), np.int64)
        a = unit_arrays(r)  # read back from the unit's folder, one unit at a time
        dom = domains.encode(r.value.counts.domains)
        fmt = formats.encode(r.value.counts.formats)
        n_unit = int(a["lengths"].shape[0])
        into = slice(at, at + n_unit)
        for key in START:
            if key in ("lines", "record_ids", "source_index", "domain_codes", "format_codes"):
                continue  # made global below
            _put(meta, key, into, a[key] if key in a else np.zeros(n_unit, np.int8))
        tokens[unit] = a["lengths"].sum(dtype=np.int64)
        _put(meta, "lines", into, a["lines"].astype(np.int64) + base)
        _put(meta, "source_index", into, inputs[a["source_index"]])
        _put(meta, "domain_codes", into, dom[a["domain_codes"]] if len(dom) else a["domain_codes"])
        _put(meta, "format_codes", into, fmt[a["format_codes"]] if len(fmt) else a["format_codes"])
        _put(meta, "record_ids", into, a["record_ids"].astype(np.int64) + accepted)
        at += n_unit
        c = r.value.counts
        np.add.at(per_source, inputs[: len(c.records_per_source)], c.records_per_source)
        n = len(domains.names)
        per_domain = add_counts(per_domain, _by_code(dom, c.records_per_domain, n))
        tokens_in = add_counts(tokens_in, _by_code(dom, c.tokens_in_per_domain, n))
        for k in policy:
            policy[k] += getattr(c, k)
        place = {s.path: k for k, s in enumerate(r.unit.ranges)}
        rejects += sorted(
            (_moved(x, base) for x in r.value.rejects),
            key=lambda x: (place.get(x.ref.source, 0), x.ref.line),
        )
        accepted += int(a["record_lines"].shape[0])
        a.clear()  # the unit's copy is merged: freed now, not after every unit is
        r.value.arrays.clear()
    counts = SpillCounts(
        sources=sources,
        domains=tuple(domains.names),
        formats=tuple(formats.names),
        records_per_source=tuple(per_source.tolist()),
        records_per_domain=tuple(per_domain.tolist()),  # each as long as the domains
        tokens_in_per_domain=tuple(tokens_in.tolist()),
        **policy,
    )
    lengths = meta.pop("lengths")
    offsets = narrow(exclusive_cumsum(lengths))  # int32 while the tokens fit
    del lengths
    empty = np.zeros(0, np.int32)
    spill = Spill(
        tokens=empty,
        labels=empty,
        offsets=offsets,
        **meta,
        counts=counts,
        part_files=PartFiles(tuple(r.value.folder for r in results), exclusive_cumsum(tokens)),
    )
    return spill, rejects


def _moved(reject: Reject, base: int) -> Reject:
    ref = SourceRef(reject.ref.source, reject.ref.line + base)
    return Reject(ref, reject.domain, reject.code, reject.reason)


def _by_code(codes: np.ndarray, values: Sequence[int], n: int) -> np.ndarray:
    out = np.zeros(n, np.int64)
    np.add.at(out, codes, np.asarray(values, np.int64))
    return out


START: dict[str, Any] = {**PER_EXAMPLE, "lengths": np.int32}
"""Each merged column's first type: the smallest where a wider one is only ever read back
(codes, parts, starts, turns, images, one byte an example while they fit), int32 for lines,
record ids, loss tokens and lengths; :func:`_put` widens a column whose values outgrow it."""
SMALL = ("source_index", "domain_codes", "format_codes", "parts", "starts", "turns", "images")


def _first_kind(key: str, kind: Any) -> Any:
    if key in SMALL:
        return np.int8
    return np.int32 if np.dtype(kind).kind == "i" and np.dtype(kind).itemsize > 4 else kind


def _put(columns: dict[str, np.ndarray], key: str, into: slice, values: np.ndarray) -> None:
    """Write ``values`` to ``columns[key][into]``, widening the column first if they outgrow it."""
    column = columns[key]
    if values.size and column.dtype.kind == "i" and values.dtype != column.dtype:
        low, high = int(values.min()), int(values.max())
        limits = np.iinfo(column.dtype)
        if low < limits.min or high > limits.max:
            wide = np.result_type(column.dtype, smallest(np.array([low, high])))
            column = columns[key] = column.astype(wide)
    column[into] = values
