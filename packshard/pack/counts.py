"""Counting as data flows: records, rejects, drops and tokens, in total and per domain.

Every record read is counted exactly once, in exactly one of three bins::

    records = records_packed + rejected + dropped

``rejected`` records failed ingest (bad JSON, unknown role, template error, …); ``dropped``
records were valid but removed by a policy (``too_long`` …).  Both are lines of
``rejects.jsonl``.  Per-domain counts add up to the totals; ``token_share_in`` is a domain's
share of tokenized tokens before the overlong policy, ``token_share_out`` its share of packed
tokens.  The collector also builds the examples index from the final plan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from packshard.pack.rows import RowPlan
from packshard.records import Reject, SourceRef
from packshard.format.shards import ShardInfo
from packshard.pack.spill import Spill

COUNT_KEYS = ("records", "rejected", "dropped", "tokens_in")


class StatsCollector:
    """Accumulates counts while ingest runs; summarises them against the final plan."""

    def __init__(self, sources: Sequence[str]) -> None:
        self.sources = list(sources)
        self._source_code = {s: i for i, s in enumerate(self.sources)}
        self.records_per_input = [0] * len(self.sources)
        self.domains: list[str] = []
        self._domain_code: dict[str, int] = {}
        self.counts: dict[str, Counter[str]] = {k: Counter() for k in COUNT_KEYS}
        self.rejects_by_code: Counter[str] = Counter()

    def source_codes(self, refs: Sequence[SourceRef]) -> np.ndarray:
        """Index of each ref's source in the input list (int32)."""
        code = self._source_code
        return np.fromiter((code[r.source] for r in refs), dtype=np.int32, count=len(refs))

    def domain_code(self, domain: str) -> int:
        """Stable small integer for a domain name (order of first appearance)."""
        if domain not in self._domain_code:
            self._domain_code[domain] = len(self.domains)
            self.domains.append(domain)
        return self._domain_code[domain]

    def domain_codes(self, domains: Sequence[str]) -> np.ndarray:
        """Codes for a sequence of domain names (int32)."""
        return np.fromiter(
            (self.domain_code(d) for d in domains), dtype=np.int32, count=len(domains)
        )

    def add_ingest(self, chunk: Any, domain_codes: np.ndarray) -> None:
        """Count a chunk's accepted and rejected records and its tokens per domain."""
        batch = chunk.batch
        for source, n in Counter(r.source for r in batch.refs).items():
            self.records_per_input[self._source_code[source]] += n
        for reject in chunk.rejects:
            self.records_per_input[self._source_code[reject.ref.source]] += 1
            self.domain_code(reject.domain)
        lengths = np.diff(batch.offsets)
        tokens = np.bincount(domain_codes, weights=lengths, minlength=len(self.domains))
        records = np.bincount(domain_codes, minlength=len(self.domains))
        for code in np.flatnonzero(records):
            name = self.domains[code]
            self.counts["records"][name] += int(records[code])
            self.counts["tokens_in"][name] += int(tokens[code])

    def add_rejects(self, rejected: Sequence[Reject], dropped: Sequence[Reject]) -> None:
        """Count rejects (records failed ingest) and drops (removed by a policy)."""
        for reject in rejected:
            self.domain_code(reject.domain)
            self.counts["records"][reject.domain] += 1
            self.counts["rejected"][reject.domain] += 1
            self.rejects_by_code[reject.code] += 1
        for reject in dropped:
            self.counts["dropped"][reject.domain] += 1
            self.rejects_by_code[reject.code] += 1

    def drop_wrapped_records(self, spill: Spill, plan: RowPlan) -> list[Reject]:
        """Rejects for records that lost every part to the no-target rule."""
        out = []
        for ex in plan.examples_dropped:
            ref = SourceRef(self.sources[spill.source_index[ex]], int(spill.lines[ex]))
            domain = self.domains[spill.domain_codes[ex]]
            out.append(
                Reject(ref, domain, "split_no_targets", "no part kept a target token (dropped)")
            )
        self.add_rejects((), out)
        return out

    def examples_table(self, spill: Spill, plan: RowPlan, shards: Sequence[ShardInfo]) -> pa.Table:
        """Build the examples index: one row per packed segment, sorted by example id."""
        order = np.argsort(plan.example_id, kind="stable")
        ex = plan.seg_example[order]
        rows = plan.segment_rows()[order]
        shard_starts = np.concatenate(([0], np.cumsum([s.rows for s in shards])))
        shard = np.searchsorted(shard_starts, rows, side="right") - 1
        sources = pa.DictionaryArray.from_arrays(
            pa.array(spill.source_index[ex]), pa.array(self.sources, pa.string())
        )
        domains = pa.DictionaryArray.from_arrays(
            pa.array(spill.domain_codes[ex]), pa.array(self.domains, pa.string())
        )
        return pa.table(
            {
                "example_id": pa.array(plan.example_id[order], pa.int64()),
                "source": sources.cast(pa.string()),
                "line": pa.array(spill.lines[ex], pa.int64()),
                "part": pa.array(plan.seg_part[order], pa.int32()),
                "token_offset": pa.array(spill.starts[ex] + plan.seg_start[order], pa.int64()),
                "domain": domains.cast(pa.string()),
                "num_tokens": pa.array(plan.seg_length[order], pa.int32()),
                "num_loss_tokens": pa.array(plan.seg_targets[order], pa.int32()),
                "truncated": pa.array(spill.truncated[ex], pa.bool_()),
                "shard": pa.array(shard, pa.int32()),
                "row": pa.array(rows - shard_starts[shard], pa.int32()),
            }
        )

    def summary(
        self,
        spill: Spill,
        plan: RowPlan,
        max_seq_len: int,
        ordering: dict[str, float],
        extra: dict[str, int],
    ) -> dict[str, Any]:
        """Return the manifest's ``stats`` block: totals, ordering bias, per-domain counts."""
        ex = plan.seg_example
        ndom = len(self.domains)
        seg_domain = spill.domain_codes[ex]
        records = spill.record_ids[ex]
        uniq_rec, rec_index = np.unique(records, return_index=True)
        rec_domain = seg_domain[rec_index]
        split_rec = np.unique(records[plan.seg_part > 0])
        split_domain = spill.domain_codes[np.searchsorted(spill.record_ids, split_rec)]

        def per_domain(values: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
            return np.bincount(values, weights=weights, minlength=ndom).astype(np.int64)

        packed = {
            "records_packed": per_domain(rec_domain),
            "examples": per_domain(seg_domain),
            "tokens": per_domain(seg_domain, plan.seg_length),
            "loss_tokens": per_domain(seg_domain, plan.seg_targets),
            "truncated": per_domain(seg_domain[spill.truncated[ex]]),
            "split": per_domain(split_domain),
        }
        tokens_in_total = sum(self.counts["tokens_in"].values())
        tokens_out_total = int(plan.seg_length.sum())
        domains: dict[str, dict[str, Any]] = {}
        for code, name in enumerate(self.domains):
            entry: dict[str, Any] = {
                "records": self.counts["records"][name],
                "rejected": self.counts["rejected"][name],
                "dropped": self.counts["dropped"][name],
            }
            entry.update({k: int(v[code]) for k, v in packed.items()})
            entry["token_share_in"] = _share(self.counts["tokens_in"][name], tokens_in_total)
            entry["token_share_out"] = _share(entry["tokens"], tokens_out_total)
            domains[name] = entry
        rows = plan.num_rows
        stats: dict[str, Any] = {
            "records": sum(self.counts["records"].values()),
            "records_packed": len(uniq_rec),
            "rejected": sum(self.counts["rejected"].values()),
            "dropped": sum(self.counts["dropped"].values()),
            "truncated": int(spill.truncated[ex].sum()),
            "split": len(split_rec),
            "examples": plan.num_segments,
            "rows": rows,
            "tokens": tokens_out_total,
            "tokens_in": int(tokens_in_total),
            "loss_tokens": int(plan.seg_targets.sum()),
            "lower_bound_rows": -(-tokens_out_total // max_seq_len),
            "fill_rate": round(tokens_out_total / (rows * max_seq_len), 6) if rows else 0.0,
            "ordering": ordering,
            "rejects_by_code": dict(sorted(self.rejects_by_code.items())),
            "domains": domains,
        }
        stats.update(extra)
        return stats


def _share(part: int, total: int) -> float:
    return round(part / total, 6) if total else 0.0
