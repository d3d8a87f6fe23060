"""Counting, once, at the end: records, rejects, drops and tokens, in total and per domain.

Every record read is counted exactly once, in exactly one of three bins::

    records = records_packed + rejected + dropped

``rejected`` records failed ingest (bad JSON, unknown role, template error, …); ``dropped``
records were valid but removed by a policy (``too_long``, ``mix_subsampled`` …).  Both are
lines of ``rejects.jsonl``.  Nothing is counted while data flows through a shared collector:
the spill writer returns what it accepted (:class:`~packshard.pack.spill.SpillCounts`), the
rejects writer what it wrote (:class:`~packshard.format.rejects.RejectTally`), the plan what
it packed, and :func:`pack_stats` combines the three.  Per-domain counts add up to the totals;
``token_share_in`` is a domain's share of tokenized tokens before the overlong policy,
``token_share_out`` its share of packed tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np
import pyarrow as pa

from packshard.arrays import exclusive_cumsum, fill_rate, lower_bound_rows
from packshard.errors import DROPPED, REJECTED
from packshard.format.examples import EXAMPLE_GROUP_ROWS, build_examples_table
from packshard.format.rejects import RejectTally
from packshard.options import resolve_loss
from packshard.pack.plan.rows import RowPlan, invert
from packshard.pack.plan.shape import pack_shape
from packshard.pack.spill import Spill
from packshard.pack.units.columns import release_columns
from packshard.records import Reject


def wrapped_drops(spill: Spill, plan: RowPlan) -> tuple[Reject, ...]:
    """Rejects for the records that lost every part to the no-target rule (``wrapped``)."""
    why = "no part kept a target token (dropped)"
    return spill.rejects(plan.examples_dropped, "split_no_targets", why)


def records_per_input(spill: Spill, tally: RejectTally) -> list[int]:
    """Count the records read from each input: accepted by ingest plus rejected by it."""
    counts = spill.counts
    return [
        accepted + tally.by_source.get(source, {}).get(REJECTED, 0)
        for source, accepted in zip(counts.sources, counts.records_per_source, strict=True)
    ]


def examples_tables(
    spill: Spill,
    plan: RowPlan,
    shard_rows: Sequence[int],
    is_eval: np.ndarray | None = None,
    repeats: np.ndarray | None = None,
    media: list[list[dict[str, Any]]] | None = None,
) -> Iterator[pa.Table]:
    """Yield the examples index in chunks of ``EXAMPLE_GROUP_ROWS`` rows, by example id.

    ``repeats`` (per segment of ``plan``, ``--mix`` only) adds the ``repeat`` column,
    ``media`` (per spilled example, a pack with images) the ``media`` column.

    One chunk is in memory at a time, and of it one numpy column at a time (each is made
    when the table reads it, from the chunk's segments' examples and rows, looked up once;
    a segment's row is found in the plan's row offsets), so beyond an int32 order per
    segment and a shard and place per row (8 bytes a row of the plan) the index costs a
    fixed amount whatever the number of examples: the chunk's Arrow table (about 97 bytes a row,
    half of it the ``source`` and ``domain`` strings) and the Parquet writer's buffers,
    about 180 bytes a row in all (measured), so about 23 MiB for a chunk of 131,072 rows.
    """
    order = invert(plan.example_id)  # the segments in example id order
    sources, domains = list(spill.counts.sources), list(spill.counts.domains)
    places = row_places(shard_rows)
    for lo in range(0, max(len(order), 1), EXAMPLE_GROUP_ROWS):
        chunk = order[lo : lo + EXAMPLE_GROUP_ROWS]
        columns = _columns(spill, plan, places, chunk, is_eval, repeats, media)
        yield build_examples_table(columns, sources, domains)
        release_columns(spill)  # the chunk's pages of the mapped columns


class _Columns(Mapping[str, np.ndarray]):
    """Columns made when read and not kept."""

    def __init__(self, makers: dict[str, Callable[[], np.ndarray]]) -> None:
        self._makers = makers

    def __getitem__(self, name: str) -> np.ndarray:
        return self._makers[name]()

    def __contains__(self, name: object) -> bool:  # Mapping's own would make the column
        return name in self._makers

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def row_places(shard_rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Return each row's shard and its row within that shard (int32), shards in order."""
    counts = np.asarray(shard_rows, dtype=np.int64)
    shard = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    first = np.repeat(exclusive_cumsum(counts)[:-1], counts)
    return shard, (np.arange(len(shard), dtype=np.int64) - first).astype(np.int32)


def _columns(
    spill: Spill,
    plan: RowPlan,
    places: tuple[np.ndarray, np.ndarray],
    order: np.ndarray,
    is_eval: np.ndarray | None = None,
    repeats: np.ndarray | None = None,
    media: list[list[dict[str, Any]]] | None = None,
) -> _Columns:
    """Return the index columns of the segments ``order`` picks, made when read.

    The chunk's segments' examples and rows are looked up once and kept while its columns
    are made (12 bytes a row of the chunk): six columns read the examples, two the rows, and
    a row's shard and place in it come from :func:`row_places`.
    """
    turns = spill.turns

    @cache  # each made once a chunk, kept while its columns are made
    def ex() -> np.ndarray:
        return plan.seg_example[order]

    @cache
    def rows() -> np.ndarray:  # each segment's row, found in the row offsets
        return np.searchsorted(plan.row_offsets, order, side="right") - 1

    def shard() -> np.ndarray:
        return places[0][rows()]

    def row() -> np.ndarray:
        return places[1][rows()]

    makers: dict[str, Callable[[], np.ndarray]] = {
        "example_id": lambda: plan.example_id[order],
        "source": lambda: spill.source_index[ex()],
        "line": lambda: spill.lines[ex()],
        "part": lambda: plan.seg_part[order],
        "token_offset": lambda: spill.starts[ex()].astype(np.int64) + plan.seg_start[order],
        "domain": lambda: spill.domain_codes[ex()],
        "num_tokens": lambda: plan.seg_length[order],
        "num_loss_tokens": lambda: plan.seg_targets[order],
        "truncated": lambda: spill.truncated[ex()],
        "shard": shard,
        "row": row,
        "turn": lambda: turns[ex()] if turns is not None else np.zeros(len(order), np.int32),
    }
    if is_eval is not None:  # with an eval split: each example's split
        makers["split"] = lambda: is_eval[ex()]
    if repeats is not None:  # with --mix: which copy of its record's example each one is
        makers["repeat"] = lambda: repeats[order]
    codes = spill.pair_codes
    if codes is not None and codes.any():  # preference or KTO records: pair_id, branch …
        makers["pair_code"] = lambda: codes[ex()]
    if media is not None:  # a pack with images: each example's, by reference
        makers["media"] = lambda: _objects([media[e] for e in ex().tolist()])
    return _Columns(makers)


def _objects(values: list[Any]) -> np.ndarray:
    """Return ``values`` as a one-dimensional object array (lists stay lists)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # one by one: equal-length lists would broadcast
        out[i] = value
    return out


def loss_policies(spill: Spill, plan: RowPlan, loss: str) -> tuple[dict[str, str], dict[str, int]]:
    """Return what ``--loss`` resolved to per format, and packed examples per policy."""
    formats = spill.counts.formats
    per_format = np.bincount(spill.format_codes[plan.seg_example], minlength=len(formats))
    resolved = {fmt: resolve_loss(loss, fmt) for fmt in sorted(formats)}
    examples: dict[str, int] = {}
    for fmt, n in zip(formats, per_format.tolist(), strict=True):
        examples[resolved[fmt]] = examples.get(resolved[fmt], 0) + n
    return resolved, dict(sorted(examples.items()))


def pack_stats(
    spill: Spill, plan: RowPlan, tally: RejectTally, ordering: dict[str, float]
) -> dict[str, Any]:
    """Return the manifest's ``stats`` block: totals, ordering bias, per-domain counts."""
    counts = spill.counts
    names = list(counts.domains) + sorted(set(tally.by_domain) - set(counts.domains))
    ex = plan.seg_example
    seg_domain = spill.domain_codes[ex]
    record_ids = spill.record_ids
    records_packed = _records_packed(spill, ex, len(names))
    split_rec = np.unique(record_ids[ex[plan.seg_part > 0]])
    split_domain = spill.domain_codes[np.searchsorted(record_ids, split_rec)]

    def per_domain(values: np.ndarray, weights: np.ndarray | None = None) -> list[int]:
        return _per_code(values, weights, len(names)).tolist()

    packed = {
        "records_packed": records_packed.tolist(),
        "examples": per_domain(seg_domain),
        "tokens": per_domain(seg_domain, plan.seg_length),
        "loss_tokens": per_domain(seg_domain, plan.seg_targets),
        "truncated": per_domain(seg_domain[spill.truncated[ex]]),
        "split": per_domain(split_domain),
    }
    accepted = list(counts.records_per_domain) + [0] * (len(names) - len(counts.domains))
    tokens_in = list(counts.tokens_in_per_domain) + [0] * (len(names) - len(counts.domains))
    tokens_out = plan.num_tokens
    domains: dict[str, dict[str, Any]] = {}
    total_in = sum(tokens_in)
    for code, name in enumerate(names):
        rejects = tally.by_domain.get(name, {})
        entry: dict[str, Any] = {
            "records": accepted[code] + rejects.get(REJECTED, 0),
            "rejected": rejects.get(REJECTED, 0),
            "dropped": rejects.get(DROPPED, 0),
            **{key: values[code] for key, values in packed.items()},
        }
        entry["token_share_in"] = _share(tokens_in[code], total_in)
        entry["token_share_out"] = _share(entry["tokens"], tokens_out)
        domains[name] = entry
    return {
        "records": sum(accepted) + tally.total(REJECTED),
        "records_packed": int(records_packed.sum()),
        "rejected": tally.total(REJECTED),
        "dropped": tally.total(DROPPED),
        "truncated": int(spill.truncated[ex].sum()),
        "split": len(split_rec),
        "examples": plan.num_segments,
        "rows": plan.num_rows,
        "tokens": tokens_out,
        "tokens_in": int(sum(tokens_in)),
        "loss_tokens": int(plan.seg_targets.sum()),
        "lower_bound_rows": lower_bound_rows(tokens_out, plan.max_seq_len),
        "fill_rate": round(fill_rate(tokens_out, plan.num_rows, plan.max_seq_len), 6),
        **pack_shape(plan),  # the spread behind fill_rate, and per optimizer step
        "ordering": ordering,
        "rejects_by_code": tally.by_code,
        "domains": domains,
        "tokens_truncated": counts.tokens_truncated,
        "parts_dropped": counts.parts_dropped + plan.parts_dropped,
    }


STATS_BLOCK = 1 << 20
"""Examples the statistics count at a time: their temporaries are this long, not the pack."""


def _per_code(codes: np.ndarray, weights: np.ndarray | None, n: int) -> np.ndarray:
    """Sum ``weights`` (1 each without) per code in ``0 … n-1``, a block of codes at a time.

    Each block's float sums are whole numbers, made int64 before they are added up: the
    same totals as one ``bincount`` of the whole, without its float64 copy of the weights.
    """
    out = np.zeros(n, np.int64)
    for lo in range(0, len(codes), STATS_BLOCK):
        part = slice(lo, lo + STATS_BLOCK)
        some = None if weights is None else weights[part]
        out += np.bincount(codes[part], weights=some, minlength=n).astype(np.int64)
    return out


def _records_packed(spill: Spill, ex: np.ndarray, n: int) -> np.ndarray:
    """Count per domain the records with at least one packed example.

    The spill's record ids ascend, so each record is a run of its examples, and a record is
    packed when any of its examples is: one byte an example marks the packed ones, and the
    runs are found a block of whole records at a time (no array of every record's start).
    """
    record_ids, domains = spill.record_ids, spill.domain_codes
    in_plan = np.zeros(len(record_ids), dtype=bool)
    in_plan[ex] = True
    out = np.zeros(n, np.int64)
    lo, total = 0, len(record_ids)
    while lo < total:
        hi = min(lo + STATS_BLOCK, total)
        if hi < total:  # end the block where a record starts
            cut = lo + int(np.searchsorted(record_ids[lo:hi], record_ids[hi], side="left"))
            hi = (
                cut
                if cut > lo
                else lo + int(np.searchsorted(record_ids[lo:], record_ids[lo], side="right"))
            )
        ids = record_ids[lo:hi]
        first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        packed_first = first[np.logical_or.reduceat(in_plan[lo:hi], first)] + lo
        out += np.bincount(domains[packed_first], minlength=n).astype(np.int64)
        lo = hi
    return out


def pair_stats(spill: Spill, plan: RowPlan, pairs_read: int) -> dict[str, Any]:
    """Return the manifest's ``stats.pairs`` and ``stats.kto`` (only in a pack that has them).

    Pairs add up pair by pair: ``seen = packed + rejected``, each pair one record whatever
    happened to it (rejected as bad input, dropped by a policy); ``truncated`` counts the
    packed pairs whose answers were cut.
    """
    codes = spill.pair_codes
    if codes is None or (not pairs_read and not codes.any()):
        return {}
    seg = codes[plan.seg_example]
    chosen = plan.seg_example[seg == 1]
    out: dict[str, Any] = {}
    if pairs_read or chosen.size:
        packed = int(chosen.size)
        cut = spill.truncated[chosen] | spill.truncated[chosen + 1]
        out["pairs"] = {
            "seen": pairs_read,
            "packed": packed,
            "rejected": pairs_read - packed,
            "truncated": int(cut.sum()),
        }
    if (seg >= 3).any():
        out["kto"] = {"desirable": int((seg == 4).sum()), "undesirable": int((seg == 3).sum())}
    return out


def _share(part: int, total: int) -> float:
    return round(part / total, 6) if total else 0.0
