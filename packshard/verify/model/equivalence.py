"""Packed-vs-unpacked model equivalence, with a leaking control that must be caught.

A packed row is only safe if a causal model computes, for every segment, exactly what it
would compute on that example alone.  This module runs a small causal language model three
ways on each sampled row and compares per-token logits and per-segment loss::

    row      [a0 a1 a2 | b0 b1 | c0 c1 c2 c3]        cu_seqlens = [0, 3, 5, 9]
    packed   positions 0 1 2  0 1  0 1 2 3 (as stored), block-causal mask:
                 a0 a1 a2 b0 b1 c0 ..
             a2 [ 1  1  1  .  .  .      ]     a token sees only earlier tokens of
             b1 [ .  .  .  1  1  .      ]     its own segment
    alone    [a0 a1 a2], [b0 b1], [c0 c1 c2 c3], each with positions 0..n-1, plain causal
    control  the same row as naive concatenation: one causal mask over all 9 tokens and
             positions 0..8, so b and c see everything before them

Checks, for each row (all in float32 unless the caller passes another model):

1. packed vs alone: max |logit delta| over every token and vocabulary entry of a segment,
   and |loss delta| (mean cross entropy of the segment's labels, shifted by one, ``-100``
   ignored; the segment's first label is ``-100`` by contract, so no label crosses a seam).
2. mutation: two more packed forwards, the odd (then the even) segments' tokens replaced at
   random; a kept segment's logits must not move.
3. control: segments after the first must differ from alone by more than
   ``max(100 * atol, 1e-3)`` under the naive mask, else check 1 would prove nothing (an
   issue too).  A row of one segment has no control ("not applicable").

Tolerance: ``atol = 1e-4`` on logits and loss: the forwards differ only in matrix shapes and
masked-out terms (softmax weight exactly 0), so packed-vs-alone noise sits decades below it
and the naive leak decades above (docs/verify.md).  A random model's loss stays near
ln(vocab) either way, so the logit leak is the control's signal.

Rotary attention sees only position differences, so resets are also checked directly (each
segment's stored positions must be ``0..n-1``).  The mask is the reader's
(:func:`packshard.torch.masks.block_causal_mask`); "alone" forwards run one segment at a time.
Problems come back as :class:`~packshard.verify.findings.Issue` values.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from packshard.errors import UsageError
from packshard.records import IGNORE_INDEX, PackedRow
from packshard.verify.findings import (
    EquivalenceReport,
    Issue,
    PairResult,
    RowResult,
    SegmentResult,
)
from packshard.verify.model.forward import Forwards, run_forwards, score_loss
from packshard.verify.model.pairs import compare_pairs, pair_issues

if TYPE_CHECKING:
    import torch

DEFAULT_ATOL = 1e-4
CONTROL_FLOOR = 1e-3


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def _mean(total: float, count: int) -> float | None:
    return total / count if count else None


def _row_problem(row: PackedRow) -> str | None:
    cu = np.asarray(row.cu_seqlens, dtype=np.int64)
    n = row.num_tokens
    if cu.size < 2 or cu[0] != 0 or cu[-1] != n or np.any(np.diff(cu) <= 0):
        return f"cu_seqlens {cu.tolist()[:8]} is not [0, …, {n}] strictly increasing"
    if row.labels.shape[0] != n or row.position_ids.shape[0] != n:
        return f"labels/position_ids lengths differ from input_ids ({n} tokens)"
    if n and int(np.min(row.input_ids)) < 0:
        return "negative token id"
    return None


def _compare_segment(
    out: Forwards, j: int, a: int, b: int, labels: np.ndarray, example_id: int
) -> tuple[SegmentResult, float, float, int]:
    """Segment ``j`` (tokens ``a:b``): its result, packed and naive loss sums, loss tokens."""
    seg_labels = labels[a:b]
    p_sum, count = score_loss(out.packed[a:b], seg_labels)
    a_sum, _ = score_loss(out.alone[j], seg_labels)
    naive_sum = score_loss(out.control[a:b], seg_labels)[0] if out.control is not None else a_sum
    control_delta = None
    if out.control is not None and j > 0:
        control_delta = _max_abs(out.control[a:b], out.alone[j])
    result = SegmentResult(
        segment=j,
        example_id=example_id,
        num_tokens=b - a,
        logit_delta=_max_abs(out.packed[a:b], out.alone[j]),
        loss_packed=_mean(p_sum, count),
        loss_alone=_mean(a_sum, count),
        loss_delta=abs(p_sum - a_sum) / count if count else 0.0,
        mutation_delta=_max_abs(out.mutated[j % 2][a:b], out.packed[a:b]) if out.mutated else None,
        control_delta=control_delta,
    )
    return result, a_sum, naive_sum, count


def _segment_issues(seg: SegmentResult, positions: np.ndarray, atol: float) -> list[str]:
    messages = []
    if not np.array_equal(positions, np.arange(positions.size)):
        messages.append(
            f"position_ids start at {positions[0]} and are not 0..{positions.size - 1} as the "
            "example has alone (rotary models cannot see a constant shift)"
        )
    if not seg.logit_delta <= atol:
        messages.append(f"packed logits differ from alone by {seg.logit_delta:.1e} > {atol:.0e}")
    if not seg.loss_delta <= atol:
        messages.append(f"packed loss differs from alone by {seg.loss_delta:.1e}")
    if seg.mutation_delta is not None and not seg.mutation_delta <= atol:
        messages.append(
            f"logits move by {seg.mutation_delta:.1e} when the neighbouring segments' tokens "
            "are replaced (attention crosses the seam)"
        )
    return messages


def check_row(
    model: Any,
    row: PackedRow,
    index: int,
    name: str,
    atol: float,
    mutate: bool,
    seed: int,
    branch: np.ndarray | None = None,
) -> tuple[RowResult | None, list[Issue], list[PairResult]]:
    """Compare one row packed, alone, mutated and under the naive control; return its issues.

    With ``branch`` (a preference row's per-segment column) its pairs are compared too
    (:func:`~packshard.verify.model.pairs.compare_pairs`, on the same forwards).
    """
    problem = _row_problem(row)
    if problem is not None:
        return None, [Issue(index, name, None, f"{problem}; row not checked")], []
    vocab = int(model.config.vocab_size)
    cu = np.asarray(row.cu_seqlens, dtype=np.int64)
    ids = np.asarray(row.input_ids, dtype=np.int64) % vocab
    labels = np.asarray(row.labels, dtype=np.int64)
    labels = np.where(labels == IGNORE_INDEX, IGNORE_INDEX, labels % vocab)
    positions = np.asarray(row.position_ids, dtype=np.int64)
    rng = np.random.default_rng(seed + index)
    out = run_forwards(model, ids, positions, cu, mutate, rng)
    pairs: list[PairResult] = []
    issues: list[Issue] = []
    if branch is not None:
        pairs, issues = compare_pairs(out, cu, labels, branch, row.example_ids, index, name)
    segments: list[SegmentResult] = []
    true_sum = naive_sum = 0.0
    count_total = 0
    for j, (a, b) in enumerate(pairwise(cu.tolist())):
        eid = int(row.example_ids[j]) if j < len(row.example_ids) else -1
        seg, a_sum, n_sum, count = _compare_segment(out, j, a, b, labels, eid)
        issues += [Issue(index, name, j, m) for m in _segment_issues(seg, positions[a:b], atol)]
        segments.append(seg)
        true_sum, naive_sum, count_total = true_sum + a_sum, naive_sum + n_sum, count_total + count
    leaks = [s.control_delta for s in segments if s.control_delta is not None]
    row_leak = max(leaks) if leaks else None
    threshold = max(100 * atol, CONTROL_FLOOR)
    verdict = "not applicable" if row_leak is None else "detected"
    if row_leak is not None and not row_leak > threshold:
        verdict = "not detected"
        why = (
            f"the naive causal control differs from alone by only {row_leak:.1e}"
            f" <= {threshold:.0e}, so this check cannot see leakage here"
            " (use a model that is sensitive to its context)"
        )
        issues.append(Issue(index, name, None, why))
    mutations = [s.mutation_delta for s in segments if s.mutation_delta is not None]
    result = RowResult(
        row=index,
        name=name,
        num_tokens=row.num_tokens,
        segments=tuple(segments),
        max_logit_delta=max(s.logit_delta for s in segments),
        max_loss_delta=max(s.loss_delta for s in segments),
        mutation_delta=max(mutations) if mutations else None,
        control_delta=row_leak,
        control=verdict,
        loss_true=_mean(true_sum, count_total),
        loss_naive=_mean(naive_sum, count_total),
        loss_tokens=count_total,
    )
    return result, issues, pairs


def _weighted(results: Sequence[RowResult], key: str) -> float | None:
    counted = [r for r in results if r.loss_tokens]
    tokens = sum(r.loss_tokens for r in counted)
    return (
        sum((getattr(r, key) or 0.0) * r.loss_tokens for r in counted) / tokens if tokens else None
    )


def check_rows(
    model: Any,
    rows: Sequence[PackedRow],
    atol: float = DEFAULT_ATOL,
    mutate: bool = True,
    names: Sequence[str] | None = None,
    seed: int = 0,
    branches: Sequence[np.ndarray | None] | None = None,
) -> EquivalenceReport:
    """Check attention isolation on ``rows`` (design invariant 5) and return the report.

    ``names`` label the rows in issues (default ``row <i>``, ``i`` the index in ``rows``).
    ``branches`` (one per row, from a preference pack) adds the pair check
    (:mod:`packshard.verify.model.pairs`): its issues, ``pairs`` and ``pair_summary``.
    """
    if names is not None and len(names) != len(rows):
        raise UsageError(f"check_rows: {len(names)} names for {len(rows)} rows")
    results: list[RowResult] = []
    issues: list[Issue] = []
    notes: list[str] = []
    vocab = int(model.config.vocab_size)
    folded = any(r.num_tokens and int(np.max(r.input_ids)) >= vocab for r in rows)
    labels = [names[i] if names is not None else f"row {i}" for i in range(len(rows))]
    pairs: list[PairResult] = []
    for i, row in enumerate(rows):
        branch = branches[i] if branches is not None else None
        result, row_issues, row_pairs = check_row(
            model, row, i, labels[i], atol, mutate, seed, branch
        )
        issues.extend(row_issues)
        pairs.extend(row_pairs)
        if result is not None:
            results.append(result)
    pair_summary = None
    if branches is not None and any(b is not None for b in branches):
        pair_found, pair_summary = pair_issues(pairs, labels, atol)
        issues.extend(pair_found)
    leaks = [r.control_delta for r in results if r.control_delta is not None]
    if not results:
        issues.append(Issue(-1, "rows", None, "no row could be checked"))
    elif not leaks:
        notes.append(
            "no checked row has two or more segments: nothing is packed together, so there"
            " is no seam to leak across and the naive control is not applicable"
        )
    if folded:
        notes.append(f"token ids >= {vocab} were folded modulo the model's vocabulary")
    mutations = [r.mutation_delta for r in results if r.mutation_delta is not None]
    return EquivalenceReport(
        rows=tuple(results),
        max_logit_delta=max((r.max_logit_delta for r in results), default=0.0),
        max_loss_delta=max((r.max_loss_delta for r in results), default=0.0),
        max_mutation_delta=max(mutations) if mutations else None,
        control_min_delta=min(leaks) if leaks else None,
        control_max_delta=max(leaks) if leaks else None,
        control_threshold=max(100 * atol, CONTROL_FLOOR),
        control_detected=bool(leaks) and all(r.control != "not detected" for r in results),
        loss_true=_weighted(results, "loss_true"),
        loss_naive=_weighted(results, "loss_naive"),
        ok=not issues,
        atol=atol,
        vocab_folded=folded,
        issues=tuple(issues),
        notes=tuple(notes),
        pairs=tuple(pairs),
        pair_summary=pair_summary,
    )
