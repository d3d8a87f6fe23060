"""The structure stage of ``verify``: a seam audit of every row, and every example once.

Each shard is audited vectorised over all of its rows (:func:`audit_shard`): every check is
a few numpy operations over the flat list values, no Python loop over tokens or rows:

* lists agree: ``input_ids``, ``labels`` and ``position_ids`` have the same offsets, and
  ``num_tokens`` equals the row's list length, ≤ ``max_seq_len``;
* ``cu_seqlens`` starts at 0, strictly increases, ends at ``num_tokens``, and has one more
  entry than ``example_ids``;
* positions restart at 0 at every segment start and count up by one (policy ``reset``);
* the first label of every segment is ``-100``; every other label is ``-100`` or its token;
* token ids lie in ``[0, vocab_size)`` (the manifest's tokenizer);
* ``num_loss_tokens`` and ``max_seqlen`` match the row; ``seq_lengths``, where the shard has
  it, is ``diff(cu_seqlens)`` (TRL keeps segments apart by it alone);
* every example id matches the examples index (this shard, this row, token counts).
* with an eval split (``split`` in the index): every example in its shard's split, and no
  record with examples in both splits.
* with ``--mix`` (``stats.mix`` in the manifest): the realised mixture recounted from the
  index (:func:`packshard.format.mixture.realised_mixture`: examples, repeats, tokens,
  trained tokens and their shares per domain) equals the recorded one, and no example is
  repeated past ``--max-repeat``.
* with preference pairs (``branch`` in the index): the shard's ``branch`` column agrees with
  the index, and each chosen segment is immediately followed, in its row, by the rejected
  segment of the same pair (so no pair is split, swapped or torn apart).

Only when a check fails does Python touch individual rows, to name them in findings.  Then
:func:`check_structure` checks that every example id of the examples index occurs in exactly
one row of one shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from packshard.arrays import count_trained
from packshard.format.examples import ExamplesIndex
from packshard.format.mixture import REALISED_KEYS, realised_mixture
from packshard.format.shards import cu_problems, list_values
from packshard.format.topology import PADDED_COLUMN, padded_rows_wrong
from packshard.records import IGNORE_INDEX
from packshard.verify.findings import Finding, FindingList

SEQ_LENGTHS_WRONG = "seq_lengths is not diff(cu_seqlens) (TRL would train across the seams)"


@dataclass(frozen=True, slots=True)
class ShardAudit:
    """Per-row results of one shard's audit (the seam table)."""

    rows: int
    segments: np.ndarray  # per row
    row_findings: np.ndarray  # per row: structural findings, listed or not
    example_ids: np.ndarray  # every example id seen in the shard, in row order
    tokens: int
    loss_tokens: int

    @property
    def bad_rows(self) -> np.ndarray:
        """Indices of the rows with at least one structural finding."""
        return np.flatnonzero(self.row_findings)


def audit_shard(
    table: pa.Table,
    shard_name: str,
    shard_index: int,
    max_seq_len: int,
    index: ExamplesIndex | None,
    findings: FindingList,
    vocab_size: int | None = None,
    multiple: int = 1,
) -> ShardAudit:
    """Check every row of a shard; add findings; return the per-row summary.

    With ``vocab_size`` every token id must also lie in ``[0, vocab_size)``; with ``multiple``
    > 1 (a recorded alignment) ``cu_seqlens_padded`` must be exact.  Without an
    ``index`` (the examples index could not be read) the index agreement is not checked.
    """
    ids, tok_off = list_values(table["input_ids"])
    labels, lab_off = list_values(table["labels"])
    pos, pos_off = list_values(table["position_ids"])
    cu, cu_off = list_values(table["cu_seqlens"])
    ex_ids, ex_off = list_values(table["example_ids"])
    num_tokens = table["num_tokens"].to_numpy()
    num_loss = table["num_loss_tokens"].to_numpy()
    max_seqlen = table["max_seqlen"].to_numpy()
    nrows = table.num_rows
    counts = np.zeros(nrows, dtype=np.int64)

    def report(rows: np.ndarray, message: str, kind: str, segs: np.ndarray | None = None) -> None:
        np.add.at(counts, rows, 1)

        def finding(k: int, r: int) -> Finding:
            seg = None if segs is None else int(segs[k])
            eid = None
            if seg is not None and ex_off[r] + seg < ex_off[r + 1]:
                eid = int(ex_ids[ex_off[r] + seg])
            where = index.where(eid) if eid is not None and index is not None else None
            return Finding("structure", message, shard_name, int(r), seg, eid, where)

        findings.add_capped("structure", kind, len(rows), (finding(*kr) for kr in enumerate(rows)))

    row_len = np.diff(tok_off)
    same = (np.array_equal(tok_off, lab_off), np.array_equal(tok_off, pos_off))
    if not all(same):
        rows = np.flatnonzero((np.diff(lab_off) != row_len) | (np.diff(pos_off) != row_len))
        report(rows, "input_ids, labels and position_ids have different lengths", "lengths")
        return ShardAudit(nrows, np.diff(ex_off), counts, ex_ids, 0, 0)
    rows = np.flatnonzero(num_tokens != row_len)
    report(rows, "num_tokens does not match the row's length", "num_tokens")
    rows = np.flatnonzero(row_len > max_seq_len)
    report(rows, f"row holds more than max_seq_len {max_seq_len} tokens", "overfull")
    if vocab_size and len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        outside = np.flatnonzero((ids < 0) | (ids >= vocab_size))
        rows = np.unique(np.searchsorted(tok_off, outside, side="right") - 1)
        report(rows, f"token id outside the vocabulary [0, {vocab_size})", "vocab")

    nseg = np.diff(cu_off) - 1
    rows = np.flatnonzero(nseg != np.diff(ex_off))
    report(rows, "cu_seqlens and example_ids disagree on the number of segments", "nseg")
    ends, broken = cu_problems(cu, cu_off, row_len)
    report(np.flatnonzero(ends), "cu_seqlens must start at 0 and end at num_tokens", "cu_ends")
    if broken.size:
        rows = np.searchsorted(cu_off, broken, side="right") - 1
        report(rows, "cu_seqlens is not strictly increasing", "cu_order", broken - cu_off[rows])
    if counts.any():
        return ShardAudit(nrows, nseg, counts, ex_ids, int(row_len.sum()), 0)

    # Segment starts in flat token coordinates.
    cu_inner = np.ones(len(cu), dtype=bool)
    cu_inner[cu_off[1:] - 1] = False  # drop each row's final entry
    row_of_cu = np.repeat(np.arange(nrows), np.diff(cu_off))
    seg_start = (cu + tok_off[row_of_cu])[cu_inner]
    seg_len = np.diff(np.append(cu, 0))[cu_inner]
    seg_row = row_of_cu[cu_inner]
    seg_local = np.arange(len(seg_start)) - np.repeat(ex_off[:-1], nseg)
    total = int(tok_off[-1])
    # int32 halves the memory traffic of the two token-length temporaries (a shard < 2**31).
    expect_pos = np.arange(total, dtype=np.int32)
    expect_pos -= np.repeat(seg_start.astype(np.int32), seg_len)

    def per_segment(segs: np.ndarray, message: str, kind: str) -> None:
        report(seg_row[segs], message, kind, seg_local[segs])

    def per_token(flat: np.ndarray, message: str, kind: str) -> None:  # once per segment
        per_segment(np.unique(np.searchsorted(seg_start, flat, side="right") - 1), message, kind)

    wrong = np.flatnonzero(pos != expect_pos)
    per_token(wrong, "position_ids do not restart at 0 at this segment", "positions")
    unmasked = np.flatnonzero(labels[seg_start] != IGNORE_INDEX)
    seam = "first label of the segment is not -100 (a target crosses the seam)"
    per_segment(unmasked, seam, "seam_label")
    trained = labels != IGNORE_INDEX
    mismatch = np.flatnonzero(trained & (labels != ids))
    per_token(mismatch, "a label is neither -100 nor its own token", "label_token")
    loss_per_row = count_trained(labels, tok_off, skip_first=False)
    report(
        np.flatnonzero(loss_per_row != num_loss),
        "num_loss_tokens does not match labels",
        "num_loss",
    )
    seg_max = np.maximum.reduceat(seg_len, ex_off[:-1]) if len(seg_len) else np.zeros(nrows)
    report(
        np.flatnonzero(seg_max != max_seqlen), "max_seqlen is not the longest segment", "max_seqlen"
    )
    if "seq_lengths" in table.column_names:  # optional column: checked when present
        report(_seq_lengths_differ(table, ex_off, seg_len), SEQ_LENGTHS_WRONG, "seq_lengths")
    for rows, message in _padded_problems(table, cu, cu_off, multiple, max_seq_len):
        report(rows, message, "cu_padded")

    if index is not None:  # None: examples.parquet missing or unreadable, an integrity finding
        at = index.lookup(ex_ids)  # -1: not in the index
        per_segment(np.flatnonzero(at < 0), "example id not in examples.parquet", "index_missing")
        if len(index.example_id):
            p = np.maximum(at, 0)
            seg_loss = count_trained(labels, np.append(seg_start, total))
            disagree = (at >= 0) & (
                (index.shard[p] != shard_index)
                | (index.row[p] != seg_row)
                | (index.num_tokens[p] != seg_len)
                | (index.num_loss_tokens[p] != seg_loss)
            )
            why = "examples.parquet disagrees with the shard (shard, row or token counts)"
            per_segment(np.flatnonzero(disagree), why, "index_disagree")
            for segs, message, kind in _pair_problems(table, ex_off, seg_row, index, at):
                per_segment(segs, message, kind)
    return ShardAudit(nrows, nseg, counts, ex_ids, total, int(trained.sum()))


def _pair_problems(
    table: pa.Table, ex_off: np.ndarray, seg_row: np.ndarray, index: ExamplesIndex, at: np.ndarray
) -> list[tuple[np.ndarray, str, str]]:
    """Return the segments that break the pair contract, with a message and a kind each.

    A pack with preference pairs (``branch`` in the index) has a ``branch`` list column
    parallel to ``example_ids`` that agrees with the index, and every chosen segment (1) is
    immediately followed, in its row, by the rejected segment (2) of the same pair.
    """
    if index.branches is None:
        return []
    if "branch" not in table.column_names:
        why = "the index names pair branches but the shard has no branch column"
        return [(np.arange(len(seg_row))[:1], why, "pair_column")]
    branch, off = list_values(table["branch"])
    if not np.array_equal(off, ex_off):
        rows = np.flatnonzero(np.diff(off) != np.diff(ex_off))
        first = ex_off[rows]
        return [(first, "the branch column and example_ids differ in length", "pair_column")]
    branch = branch.astype(np.int8)
    known = at >= 0
    want = np.where(known, index.branches[np.maximum(at, 0)], branch)
    out = [(np.flatnonzero(branch != want), "branch disagrees with examples.parquet", "pair_index")]
    pair = index.pair_ids[np.maximum(at, 0)] if index.pair_ids is not None else at
    n = len(branch)
    nxt = np.minimum(np.arange(n) + 1, max(n - 1, 0))
    follows = (np.arange(n) + 1 < n) & (seg_row[nxt] == seg_row) & (branch[nxt] == 2)
    follows &= pair[nxt] == pair
    chosen = np.flatnonzero((branch == 1) & ~follows)
    out.append(
        (chosen, "a chosen branch is not followed in its row by its rejected one", "pair_split")
    )
    prv = np.maximum(np.arange(n) - 1, 0)
    led = (np.arange(n) > 0) & (seg_row[prv] == seg_row) & (branch[prv] == 1) & (pair[prv] == pair)
    rejected = np.flatnonzero((branch == 2) & ~led)
    out.append(
        (rejected, "a rejected branch does not follow its chosen one in its row", "pair_split")
    )
    return out


def _padded_problems(
    table: pa.Table, cu: np.ndarray, cu_off: np.ndarray, multiple: int, max_seq_len: int
) -> list[tuple[np.ndarray, str]]:
    """Return the rows whose ``cu_seqlens_padded`` disagrees with the recorded alignment."""
    present = PADDED_COLUMN in table.column_names
    if multiple == 1 and not present:
        return []
    if not present:
        why = f"the manifest records an alignment of {multiple}; the shard has no {PADDED_COLUMN}"
        return [(np.arange(table.num_rows), why)]
    if multiple == 1:
        why = f"{PADDED_COLUMN} in a pack that records no alignment (config.alignment)"
        return [(np.arange(table.num_rows), why)]
    padded, padded_off = list_values(table[PADDED_COLUMN])
    rows = padded_rows_wrong(cu, cu_off, padded, padded_off, multiple, max_seq_len)
    why = (
        f"{PADDED_COLUMN} is not each segment rounded up to a multiple of {multiple} "
        f"within max_seq_len {max_seq_len}"
    )
    return [(rows, why)]


def _seq_lengths_differ(table: pa.Table, seg_off: np.ndarray, seg_len: np.ndarray) -> np.ndarray:
    """Return the rows whose ``seq_lengths`` is not their segments' lengths."""
    column = table["seq_lengths"]
    if column.null_count:
        return np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))
    values, offsets = list_values(column)
    if not np.array_equal(offsets, seg_off):
        return np.flatnonzero(np.diff(offsets) != np.diff(seg_off))
    wrong = np.flatnonzero(values != seg_len)
    return np.unique(np.searchsorted(seg_off, wrong, side="right") - 1)


def check_structure(
    manifest: dict[str, Any],
    tables: dict[int, pa.Table],
    index: ExamplesIndex | None,
    findings: FindingList,
) -> dict[int, ShardAudit]:
    """Audit every opened shard, then check that every example occurs exactly once."""
    # Without a recorded max_seq_len (an invalid manifest, already a finding) skip capacity.
    max_seq_len = int(manifest.get("config", {}).get("max_seq_len") or np.iinfo(np.int32).max)
    vocab_size = int(manifest.get("tokenizer", {}).get("vocab_size") or 0) or None
    multiple = int((manifest.get("config", {}).get("alignment") or {}).get("multiple") or 1)
    audits = {}
    for i, table in sorted(tables.items()):
        name = manifest["shards"][i]["path"]
        audits[i] = audit_shard(table, name, i, max_seq_len, index, findings, vocab_size, multiple)
    if len(audits) == len(manifest.get("shards", [])) and index is not None:
        _check_each_example_once(audits, index, findings)
    if index is not None and index.is_eval is not None:
        _check_splits(manifest, index, findings)
    if index is not None and ("mix" in manifest.get("stats", {}) or index.repeats is not None):
        _check_mix(manifest, index, findings)
    return audits


def _check_mix(manifest: dict[str, Any], index: ExamplesIndex, findings: FindingList) -> None:
    """Recount the realised mixture from the index; it must equal ``stats.mix``."""
    mix = manifest.get("stats", {}).get("mix")
    recorded = mix.get("domains") if isinstance(mix, dict) else None

    def wrong(message: str) -> None:
        findings.add(Finding("structure", message), "mix_mismatch")

    if not isinstance(recorded, dict) or index.repeats is None or index.domain_code is None:
        wrong("the manifest's stats.mix and examples.parquet's repeat column come only together")
        return
    names = list(recorded)
    code = {name: i for i, name in enumerate(names)}
    lookup = np.array([code.get(name, -1) for name in index.domain_names] or [-1])
    domain = lookup[index.domain_code.astype(np.int64)] if len(index.domain_code) else lookup[:0]
    if (domain < 0).any():
        unknown = index.domain_names[int(index.domain_code[np.argmax(domain < 0)])]
        wrong(f"examples.parquet holds domain {unknown!r}, which stats.mix does not record")
        return
    realised = realised_mixture(
        domain, index.num_tokens, index.num_loss_tokens, index.repeats, names
    )
    for name in names:
        entry = recorded[name] if isinstance(recorded[name], dict) else {}
        for key in REALISED_KEYS:
            if entry.get(key) != realised[name][key]:
                wrong(
                    f"domain {name!r}: the manifest records {key} {entry.get(key)}, the shards "
                    f"and examples index hold {realised[name][key]}"
                )
    cap = mix.get("max_repeat") if isinstance(mix, dict) else None
    most = int(index.repeats.max()) + 1 if len(index.repeats) else 0
    if isinstance(cap, int) and most > cap:
        wrong(f"an example is packed {most} times, more than --max-repeat {cap}")


def _check_splits(manifest: dict[str, Any], index: ExamplesIndex, findings: FindingList) -> None:
    """Check an eval split: each example in its shard's split, no record in both splits."""
    entries = manifest.get("shards", [])
    shard_eval = np.array([s.get("split", "train") == "eval" for s in entries] or [False])
    assert index.is_eval is not None
    shard = np.clip(index.shard.astype(np.int64), 0, len(shard_eval) - 1)  # range: checked above
    wrong = np.flatnonzero(shard_eval[shard] != index.is_eval)
    key = index.source_code.astype(np.int64) << 40 | index.lines.astype(np.int64)
    both = np.intersect1d(key[index.is_eval], key[~index.is_eval])
    leaked = np.flatnonzero(np.isin(key, both) & index.is_eval)
    for at, kind, message in (
        (wrong, "split_mismatch", "examples.parquet names another split than the example's shard"),
        (leaked, "split_leak", "a record has examples in both the train and the eval split"),
    ):
        _add_examples(findings, index, index.example_id[at], kind, message)


def _check_each_example_once(
    audits: dict[int, ShardAudit], index: ExamplesIndex, findings: FindingList
) -> None:
    seen = np.concatenate([a.example_ids for a in audits.values()]) if audits else np.zeros(0)
    seen = seen.astype(np.int64, copy=False)
    n = len(index.example_id)
    if index.dense and (not len(seen) or (seen.min() >= 0 and seen.max() < n)):
        times = np.bincount(seen, minlength=n)  # O(n), the common case
        duplicated, missing = np.flatnonzero(times > 1), np.flatnonzero(times == 0)
    else:
        uniq, counts = np.unique(seen, return_counts=True)
        duplicated, missing = uniq[counts > 1], np.setdiff1d(index.example_id, uniq)
    for ids, kind, message in (
        (duplicated, "duplicate", "example appears more than once across shards"),
        (missing, "missing_example", "example listed in examples.parquet is in no row"),
    ):
        _add_examples(findings, index, ids, kind, message)


def _add_examples(
    findings: FindingList, index: ExamplesIndex, ids: np.ndarray, kind: str, message: str
) -> None:
    """Add a finding per example id, each at its source line (counted past the cap)."""
    listed = (int(e) for e in ids)
    first = (Finding("structure", message, example_id=e, source=index.where(e)) for e in listed)
    findings.add_capped("structure", kind, len(ids), first)
